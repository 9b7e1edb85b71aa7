"""What the framework modules of tasks and model kinds share, one module per framework (`jax.py`, `tf.py`,
`torch.py`): activations by HF name, dropout, and how parameters are named. Only that framework's backend imports
them."""

"""tpuplex's PyTorch backend: HF transformers models, eager on CPU/GPU through accelerate, torch_xla SPMD on TPU.

The backend class is `tpuplex_torch.backend.TorchBackend`, registered under the `tpuplex.backends` entry point.
"""

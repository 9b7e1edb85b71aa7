"""Kim (2014)'s convolutional sentence classifier written in each framework: the framework-native path of a model
of your own (docs/own-model.md), which the user-model tests train on every backend.

Each version maps (input_ids, token_type_ids, attention_mask) int [B, L] to logits float32 [B, num_labels]:
token embeddings [B, L, E] -> for each width w, a 'same' 1-D convolution with `filters` outputs and ReLU ->
the maximum over real (unpadded) positions -> concatenation [B, filters * len(widths)] -> dropout -> linear.
A config names them all at once as `native_textcnn.{backend}_model:TextCNN`.
"""

EMBEDDING_SIZE = 128
FILTERS = 100
WIDTHS = (3, 5, 7)  # odd, so "same" padding is symmetric in every framework
DROPOUT = 0.5

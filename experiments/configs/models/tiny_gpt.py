"""A small GPT-style language model for `terse run` (workload pytorch, module; experiments/configs/pytorch_gpt.textproto).

terse imports this file and calls model() once per rank and data(rank, world) for that rank's inputs; the model's
output is logits over the labels, which may carry extra dimensions (here: a sequence), flattened for the
cross-entropy loss. Any file with these two functions can stand in for it.

The model: byte embeddings and learned positions, LAYERS pre-norm decoder blocks (causal self-attention, a GELU MLP)
from torch.nn's TransformerEncoderLayer under a causal mask, a final LayerNorm and a linear head: 0.8M parameters.
The data: the fortune cookies of Debian's `fortunes` package (2.5 MB of English) as bytes, cut into windows of
CONTEXT + 1 bytes (input and the next byte at every position); the last tenth of the windows is the test set.
"""

import os

import torch
import torch.nn as nn

CORPUS = os.environ.get("TERSE_GPT_CORPUS", "/usr/share/games/fortunes")
CONTEXT = 64
VOCAB = 256  # bytes
WIDTH = 128
HEADS = 4
LAYERS = 4
TEST_WINDOWS = 256  # evaluated at every evaluation point: kept small so that evaluation stays cheap on a CPU


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, dim_feedforward=4 * WIDTH, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("causal", torch.triu(torch.full((CONTEXT, CONTEXT), float("-inf")), diagonal=1),
                             persistent=False)
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, x):
        t = x.shape[1]
        h = self.tokens(x) + self.positions[:t]
        h = self.blocks(h, mask=self.causal[:t, :t])
        return self.head(self.norm(h))


def model():
    return TinyGPT()


def _corpus_bytes():
    if os.path.isdir(CORPUS):
        names = sorted(n for n in os.listdir(CORPUS) if not n.endswith(".dat"))
        paths = [os.path.join(CORPUS, n) for n in names]
        paths = [p for p in paths if os.path.isfile(p) and not os.path.islink(p)]
    else:
        paths = [CORPUS]
    if not paths:
        raise FileNotFoundError("tiny_gpt: no text under %s (apt-get install fortunes, or set TERSE_GPT_CORPUS)"
                                % CORPUS)
    return b"".join(open(p, "rb").read() for p in paths)


def data(rank, world):
    text = torch.frombuffer(bytearray(_corpus_bytes()), dtype=torch.uint8).long()
    windows = (len(text) - 1) // CONTEXT
    starts = torch.arange(windows) * CONTEXT
    n_test = max(1, windows // 10)
    train_starts, test_starts = starts[:-n_test], starts[-n_test:][:TEST_WINDOWS]

    def cut(s):
        index = s.unsqueeze(1) + torch.arange(CONTEXT + 1)
        w = text[index]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    # An equal share of the training windows per rank, interleaved so that every rank sees the whole corpus's mix.
    per = len(train_starts) // world
    mine = train_starts[rank::world][:per]
    return cut(mine), cut(test_starts)

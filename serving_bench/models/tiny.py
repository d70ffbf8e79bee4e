"""Small test models that export, compile and serve in seconds: ``tiny_cnn`` (image-like) and ``tiny_mlp``."""

from __future__ import annotations

from torch import nn


class TinyCNN(nn.Module):
    """3x32x32 image -> 10 logits: two convolutions (one with batch norm), global average pooling, a linear head."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, num_classes)
        # non-trivial batch-norm statistics so folding them is actually exercised
        self.features[1].running_mean.uniform_(-0.5, 0.5)
        self.features[1].running_var.uniform_(0.5, 1.5)

    def forward(self, input):  # noqa: A002 - the argument name is the tensor name in every framework
        return self.head(self.features(input))


class TinyMLP(nn.Module):
    """16 features -> 8 outputs: Linear, GELU, Linear."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, input):  # noqa: A002
        return self.net(input)

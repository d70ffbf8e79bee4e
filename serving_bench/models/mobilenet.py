"""MobileNetV3-Large with torchvision's exact architecture (5,483,032 parameters), in plain torch.

Module names follow torchvision (``features.N.block``, ``avgpool``, ``classifier``) and so does the initialisation
(Kaiming-normal fan-out convolutions, unit norms, N(0, 0.01) linear layers, zero biases). Eval mode only matters here
(dropout is inactive), weights are random.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to a multiple of ``divisor`` without going more than 10% below it (as in the paper's code)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


def conv_bn_act(inp: int, out: int, kernel: int, stride: int = 1, groups: int = 1,
                activation: type[nn.Module] | None = nn.Hardswish, dilation: int = 1) -> nn.Sequential:
    """torchvision's ``Conv2dNormActivation`` (conv without bias, batch norm eps 1e-3 momentum 0.01, activation)."""
    padding = (kernel - 1) // 2 * dilation
    layers: list[nn.Module] = [
        nn.Conv2d(inp, out, kernel, stride, padding, dilation=dilation, groups=groups, bias=False),
        nn.BatchNorm2d(out, eps=0.001, momentum=0.01)]
    if activation is not None:
        layers.append(activation(inplace=True))
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


@dataclass(frozen=True)
class BlockSetting:
    inp: int
    kernel: int
    expanded: int
    out: int
    use_se: bool
    hardswish: bool
    stride: int


# (input, kernel, expanded, output, squeeze-excite, hardswish, stride) of MobileNetV3-Large
LARGE_SETTINGS = tuple(BlockSetting(*row) for row in [
    (16, 3, 16, 16, False, False, 1),
    (16, 3, 64, 24, False, False, 2),
    (24, 3, 72, 24, False, False, 1),
    (24, 5, 72, 40, True, False, 2),
    (40, 5, 120, 40, True, False, 1),
    (40, 5, 120, 40, True, False, 1),
    (40, 3, 240, 80, False, True, 2),
    (80, 3, 200, 80, False, True, 1),
    (80, 3, 184, 80, False, True, 1),
    (80, 3, 184, 80, False, True, 1),
    (80, 3, 480, 112, True, True, 1),
    (112, 3, 672, 112, True, True, 1),
    (112, 5, 672, 160, True, True, 2),
    (160, 5, 960, 160, True, True, 1),
    (160, 5, 960, 160, True, True, 1),
])


class InvertedResidual(nn.Module):
    def __init__(self, cfg: BlockSetting):
        super().__init__()
        self.use_res_connect = cfg.stride == 1 and cfg.inp == cfg.out
        act = nn.Hardswish if cfg.hardswish else nn.ReLU
        layers: list[nn.Module] = []
        if cfg.expanded != cfg.inp:
            layers.append(conv_bn_act(cfg.inp, cfg.expanded, 1, activation=act))
        layers.append(conv_bn_act(cfg.expanded, cfg.expanded, cfg.kernel, cfg.stride, groups=cfg.expanded,
                                  activation=act))
        if cfg.use_se:
            layers.append(SqueezeExcitation(cfg.expanded, make_divisible(cfg.expanded // 4, 8)))
        layers.append(conv_bn_act(cfg.expanded, cfg.out, 1, activation=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        out = self.block(x)
        return out + x if self.use_res_connect else out


class MobileNetV3(nn.Module):
    def __init__(self, settings: tuple[BlockSetting, ...] = LARGE_SETTINGS, last_channel: int = 1280,
                 num_classes: int = 1000, dropout: float = 0.2):
        super().__init__()
        layers: list[nn.Module] = [conv_bn_act(3, settings[0].inp, 3, stride=2)]
        layers += [InvertedResidual(cfg) for cfg in settings]
        last_conv = 6 * settings[-1].out
        layers.append(conv_bn_act(settings[-1].out, last_conv, 1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(last_conv, last_channel), nn.Hardswish(inplace=True),
                                        nn.Dropout(p=dropout, inplace=True), nn.Linear(last_channel, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, input):  # noqa: A002 - the argument name is the tensor name in every framework
        return self.classifier(self.avgpool(self.features(input)).flatten(1))


def mobilenet_v3_large() -> MobileNetV3:
    return MobileNetV3()

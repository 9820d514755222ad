"""Image model factories, built from a Dataset's shapes.

They follow the papers the attacks come from (SelectiveShield's MLP/SimpleCNN, the DLG
LeNet, the iLRG LeNet-5, torchvision ResNet-18) and adapt to the input size so every model
runs on 8x8 digits, 28x28 MNIST and 32x32 CIFAR. Text models live in bench/models/text.py.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from bench.data.loading import Dataset
from bench.registry import MODELS


def _image_shape(data: Dataset, model: str) -> tuple[int, int, int]:
    if data.task != "classification" or len(data.input_shape) != 3:
        raise ValueError(f"model '{model}' needs image classification data (C,H,W); "
                         f"dataset '{data.name}' is {data.task} with input shape {data.input_shape}")
    return tuple(data.input_shape)


def _flat_size(body: nn.Module, shape: tuple[int, ...]) -> int:
    """Features the body produces for one input, found by running it once (works for any input size)."""
    was_training = body.training
    body.eval()
    with torch.no_grad():
        n = body(torch.zeros(1, *shape)).numel()
    body.train(was_training)
    return n


class Classifier(nn.Sequential):
    """features -> flatten -> classifier; a Sequential so parameter names stay short and stable."""

    def __init__(self, features: nn.Module, shape: tuple[int, ...], head: Callable[[int], nn.Module]):
        super().__init__()
        self.features = features
        self.flatten = nn.Flatten()
        self.classifier = head(_flat_size(features, shape))


@MODELS.register("mlp", "SelectiveShield MLP: flatten, 256, 128, classes (ReLU)")
def mlp(data: Dataset) -> nn.Module:
    shape = _image_shape(data, "mlp")
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, data.num_classes))


@MODELS.register("simplecnn", "SelectiveShield SimpleCNN: 2x (conv3x3, BN, ReLU, maxpool), FC 256, classes")
def simplecnn(data: Dataset) -> nn.Module:
    shape = _image_shape(data, "simplecnn")
    features = nn.Sequential(
        nn.Conv2d(shape[0], 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
    return Classifier(features, shape, lambda n: nn.Sequential(nn.Linear(n, 256), nn.ReLU(),
                                                               nn.Linear(256, data.num_classes)))


@MODELS.register("fcn", "SenseCrypt FCN: flatten, hidden (default 64, ReLU), classes; 50,890 parameters on 28x28")
def fcn(data: Dataset, hidden: int = 64) -> nn.Module:
    """SenseCrypt's FCN for FMNIST. The paper gives no layers; its appendix table 4 counts 50,890
    parameters for its MLP, which is exactly 784-64-10, the MLP of the authors' earlier Paillier FL
    code (liyan2015/AdaptiveBatchHE). Its dropout is left out: it would make the sensitivity random."""
    shape = _image_shape(data, "fcn")
    if not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"fcn hidden must be an int >= 1, got {hidden!r}")
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, data.num_classes))


@MODELS.register("alexnet-cifar", "SenseCrypt's CIFAR-10 'AlexNet': 5x (conv3x3, ReLU, maxpool) 6-16-32-64-128, "
                                  "FC 120, 84, classes; 124,534 parameters at 32x32")
def alexnet_cifar(data: Dataset) -> nn.Module:
    """SenseCrypt trains an 'AlexNet' on CIFAR-10 and counts 124,534 parameters for it (appendix table 4);
    torchvision's AlexNet has 57 M. The count is exactly that of the five-conv network of the authors'
    earlier Paillier FL code (liyan2015/AdaptiveBatchHE, class Net), rebuilt here. Inputs under 32 px
    skip the pools that would shrink a side below one pixel (so it also runs on 28x28 and 8x8)."""
    shape = _image_shape(data, "alexnet-cifar")
    layers, cin, side = [], shape[0], min(shape[1:])
    for cout in (6, 16, 32, 64, 128):
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
        if side >= 2:
            layers.append(nn.MaxPool2d(2))
            side //= 2
        cin = cout
    return Classifier(nn.Sequential(*layers), shape, lambda n: nn.Sequential(
        nn.Linear(n, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, data.num_classes)))


@MODELS.register("lenet5-sigmoid", "DLG/iDLG LeNet: 3 sigmoid convs (12 ch, 5x5), one FC; uniform(-0.5,0.5) init")
def lenet5_sigmoid(data: Dataset) -> nn.Module:
    """The DLG LeNet; like DLG, every weight and bias is drawn from U(-0.5, 0.5), which keeps the
    sigmoid gradients large enough for gradient inversion to converge."""
    shape = _image_shape(data, "lenet5-sigmoid")
    features = nn.Sequential(
        nn.Conv2d(shape[0], 12, 5, padding=2, stride=2), nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid())
    model = Classifier(features, shape, lambda n: nn.Linear(n, data.num_classes))   # n=768 at 32x32, 588 at 28x28
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    return model


_ACTIVATIONS = {"relu": nn.ReLU, "silu": nn.SiLU, "leakyrelu": nn.LeakyReLU}


@MODELS.register("lenet5-relu", "iLRG LeNet-5: 2x (conv5x5, act, maxpool), FC 120, 84, classes")
def lenet5_relu(data: Dataset, activation: str = "relu") -> nn.Module:
    """Unpadded 5x5 convs need inputs >= 16 px; smaller ones (8x8 digits) use padding 2 instead."""
    shape = _image_shape(data, "lenet5-relu")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"lenet5-relu activation must be one of {', '.join(_ACTIVATIONS)}, got '{activation}'")
    act = _ACTIVATIONS[activation]
    pad = 0 if min(shape[1:]) >= 16 else 2
    features = nn.Sequential(nn.Conv2d(shape[0], 6, 5, padding=pad), act(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5, padding=pad), act(), nn.MaxPool2d(2))
    return Classifier(features, shape, lambda n: nn.Sequential(nn.Linear(n, 120), act(), nn.Linear(120, 84), act(),
                                                               nn.Linear(84, data.num_classes)))


@MODELS.register("resnet18", "torchvision ResNet-18, random init; CIFAR-style stem for inputs under 64 px; "
                             "width scales every layer's channels (64 = torchvision's)")
def resnet18(data: Dataset, width: int = 64) -> nn.Module:
    """Inputs under 64 px get the CIFAR stem (3x3 stride-1 conv, no max-pool) so the feature maps are
    not pooled away; under 16 px layer4 also keeps stride 1, so BatchNorm still sees more than one value
    per channel at batch size 1. Other channel counts get a stem conv with that many input channels.
    `width` < 64 scales every conv, BatchNorm and the head by width / 64 (same depth, blocks and names):
    a CI slice of a ResNet-18 suite runs the architecture without encrypting 11M parameters."""
    from torchvision.models import resnet18 as tv_resnet18
    if not isinstance(width, int) or not 1 <= width <= 64:
        raise ValueError(f"resnet18 width must be an int in 1..64, got {width!r}")
    c, h, w = _image_shape(data, "resnet18")
    model = tv_resnet18(weights=None, num_classes=data.num_classes)
    if width != 64:
        _scale_channels(model, width / 64)
    if min(h, w) < 64:
        model.conv1 = nn.Conv2d(c, width, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif c != 3:
        model.conv1 = nn.Conv2d(c, width, 7, stride=2, padding=3, bias=False)
    if min(h, w) < 16:
        model.layer4[0].conv1.stride = (1, 1)
        model.layer4[0].downsample[0].stride = (1, 1)
    return model


def _scale_channels(model: nn.Module, factor: float) -> None:
    """Replace every Conv2d / BatchNorm2d / Linear by one with channel counts scaled (the input image's
    channels and the classes stay), keeping module names, kernels, strides and torchvision's init."""
    def scaled(n: int) -> int:
        return max(1, round(n * factor))
    for name, module in list(model.named_modules()):
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Conv2d):
            ins = module.in_channels if name == "conv1" else scaled(module.in_channels)
            new = nn.Conv2d(ins, scaled(module.out_channels), module.kernel_size, module.stride, module.padding,
                            bias=module.bias is not None)
            nn.init.kaiming_normal_(new.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            new = nn.BatchNorm2d(scaled(module.num_features))
        elif isinstance(module, nn.Linear):
            new = nn.Linear(scaled(module.in_features), module.out_features)
        else:
            continue
        setattr(parent, leaf, new)

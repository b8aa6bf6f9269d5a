"""Models built from :mod:`orthojax.nn`: ResNet, VGG-6 and the one-hidden-layer MLP;
the deep critical MLP (scanned), the sequence RNN, deep linear networks and a decoder-only
transformer language model (scanned blocks)."""

from orthojax.models._deep_linear import DeepLinear
from orthojax.models._deep_mlp import DeepMLP
from orthojax.models._mlp import MLP
from orthojax.models._resnet import ResNet
from orthojax.models._resnet import ResNet18
from orthojax.models._resnet import ResNet34
from orthojax.models._resnet import ResNet50
from orthojax.models._resnet import ResNet101
from orthojax.models._rnn import SequenceRNN
from orthojax.models._transformer import TransformerLM
from orthojax.models._variants import Unit
from orthojax.models._vgg import VGG6

__all__ = [
    "DeepLinear",
    "DeepMLP",
    "MLP",
    "ResNet",
    "ResNet18",
    "ResNet34",
    "ResNet50",
    "ResNet101",
    "SequenceRNN",
    "TransformerLM",
    "Unit",
    "VGG6",
]

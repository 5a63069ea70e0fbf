"""Models as projects write them, each one a way a recorder could disturb the test that runs it."""

import random
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap


class LazyShape(tuple):
    """A library's representation type whose length raises until it is resolved."""

    def __len__(self):
        raise RuntimeError("a lazy shape has no length yet")


class Settings:
    """A configuration object whose repr and comparison raise."""

    def __init__(self, dim):
        self.dim = dim

    def __repr__(self):
        raise RuntimeError("Settings cannot be shown")

    def __eq__(self, other):
        raise RuntimeError("Settings cannot be compared")

    __hash__ = object.__hash__


class Shaped(nn.Module):
    def __init__(self, shape, settings=None, dim=8):
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return F.log_softmax(self.fc(x), dim=-1)


class Lookup(nn.Module):
    def __init__(self, vocab=16, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.out(self.emb(ids).mean(dim=1))


class Flagged(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x, flag=False):
        y = self.fc(x)
        if flag:
            return torch.log(torch.softmax(y, dim=-1))
        return y


class Dropper(nn.Module):
    def __init__(self, dim=8, p=0.5):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        noise = torch.randn_like(x) * 0.1
        return self.drop(self.fc(x + noise))


class Noisy(nn.Module):
    """Warns and draws from Python's generator in its forward."""

    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        warnings.warn("Noisy is deprecated, use Flagged", UserWarning, stacklevel=2)
        return self.fc(x) * random.random()


class PerSampleGrads(nn.Module):
    """Per-sample gradients of an inner layer with torch.func, in the forward."""

    def __init__(self, dim=4):
        super().__init__()
        self.inner = nn.Linear(dim, 1)

    def forward(self, x):
        params = {name: p.detach() for name, p in self.inner.named_parameters()}

        def loss(p, sample):
            return functional_call(self.inner, p, (sample,)).sum()

        return vmap(grad(loss), in_dims=(None, 0))(params, x)["weight"]


class Sampler(nn.Module):
    """Driven by its own method, not by a call."""

    def __init__(self, dim=4):
        super().__init__()
        self.dim = dim
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))

    def forward(self, z):
        return self.net(z)

    def sample(self, n):
        return self.forward(torch.randn(n, self.dim))


class Gate(nn.Module):
    """A mixture-of-experts gate through torch.distributions (argument checks on by default)."""

    def __init__(self, dim=8, experts=4):
        super().__init__()
        self.fc = nn.Linear(dim, experts)

    def forward(self, x):
        logits = self.fc(x)
        noise = torch.distributions.Normal(torch.zeros_like(logits), torch.ones_like(logits))
        return noise.cdf(logits)


class Talker(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        print(f"Talker saw {tuple(x.shape)}")
        return self.fc(x)

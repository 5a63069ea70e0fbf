"""Written in the style of bottom-up-attention-vqa (hengyuan-hu/bottom-up-attention-vqa, fc.py, classifier.py,
attention.py and base_model.py).

Weight-normalised FCNet layers (`weight_norm(nn.Linear(...), dim=None)` then `nn.ReLU()`), the question
embedded by a GRU, NewAttention over the image's object features (`v_proj * q_proj.repeat(1, k, 1)`, dropout,
a linear to one logit per object, `nn.functional.softmax(logits, 1)`, then `(att * v).sum(1)`: a weighted
sum of objects, not softmax(QKᵀ)V), and SimpleClassifier, whose `nn.Sequential` puts
`nn.Dropout(dropout, inplace=True)` right after `nn.ReLU()`: the dropout overwrites the output that the ReLU
saved for its backward, and training stops at `loss.backward()` on current PyTorch.
"""

import warnings

import torch
from torch import nn

from torch.nn.utils import weight_norm as _weight_norm

STYLE = "bottom-up-attention-vqa (weight-normed FCNet, in-place classifier dropout)"
REPOSITORY = "hengyuan-hu/bottom-up-attention-vqa"
BACKWARD_FAILS = True  # nn.Dropout(inplace=True) after nn.ReLU()


def weight_norm(module, dim=None):
    """torch.nn.utils.weight_norm, as the repository calls it, without its deprecation warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return _weight_norm(module, dim=dim)


class FCNet(nn.Module):
    def __init__(self, dims):
        super().__init__()
        layers = []
        for i in range(len(dims) - 2):
            in_dim = dims[i]
            out_dim = dims[i + 1]
            layers.append(weight_norm(nn.Linear(in_dim, out_dim), dim=None))
            layers.append(nn.ReLU())
        layers.append(weight_norm(nn.Linear(dims[-2], dims[-1]), dim=None))
        layers.append(nn.ReLU())
        self.main = nn.Sequential(*layers)

    def forward(self, x):
        return self.main(x)


class SimpleClassifier(nn.Module):
    def __init__(self, in_dim, hid_dim, out_dim, dropout):
        super().__init__()
        layers = [
            weight_norm(nn.Linear(in_dim, hid_dim), dim=None),
            nn.ReLU(),
            nn.Dropout(dropout, inplace=True),
            weight_norm(nn.Linear(hid_dim, out_dim), dim=None),
        ]
        self.main = nn.Sequential(*layers)

    def forward(self, x):
        return self.main(x)


class NewAttention(nn.Module):
    def __init__(self, v_dim, q_dim, num_hid, dropout=0.2):
        super().__init__()
        self.v_proj = FCNet([v_dim, num_hid])
        self.q_proj = FCNet([q_dim, num_hid])
        self.dropout = nn.Dropout(dropout)
        self.linear = weight_norm(nn.Linear(q_dim, 1), dim=None)

    def forward(self, v, q):
        logits = self.logits(v, q)
        w = nn.functional.softmax(logits, 1)
        return w

    def logits(self, v, q):
        batch, k, _ = v.size()
        v_proj = self.v_proj(v)  # [batch, k, qdim]
        q_proj = self.q_proj(q).unsqueeze(1).repeat(1, k, 1)
        joint_repr = v_proj * q_proj
        joint_repr = self.dropout(joint_repr)
        logits = self.linear(joint_repr)
        return logits


class QuestionEmbedding(nn.Module):
    def __init__(self, in_dim, num_hid):
        super().__init__()
        self.rnn = nn.GRU(in_dim, num_hid, 1, batch_first=True)

    def forward(self, x):
        output, _ = self.rnn(x)
        return output[:, -1]


class BaseModel(nn.Module):
    def __init__(self, ntoken=64, emb_dim=16, num_hid=32, v_dim=24, num_ans=10):
        super().__init__()
        self.w_emb = nn.Embedding(ntoken + 1, emb_dim, padding_idx=ntoken)
        self.q_emb = QuestionEmbedding(emb_dim, num_hid)
        self.v_att = NewAttention(v_dim, num_hid, num_hid)
        self.q_net = FCNet([num_hid, num_hid])
        self.v_net = FCNet([v_dim, num_hid])
        self.classifier = SimpleClassifier(num_hid, 2 * num_hid, num_ans, 0.5)

    def forward(self, v, q):
        w_emb = self.w_emb(q)
        q_emb = self.q_emb(w_emb)  # [batch, q_dim]
        att = self.v_att(v, q_emb)
        v_emb = (att * v).sum(1)  # [batch, v_dim]
        q_repr = self.q_net(q_emb)
        v_repr = self.v_net(v_emb)
        joint_repr = q_repr * v_repr
        logits = self.classifier(joint_repr)
        return logits


def make_model():
    torch.manual_seed(0)
    features = torch.randn(2, 6, 24)  # 6 detected objects per image
    question = torch.randint(0, 64, (2, 8))
    return BaseModel(), (features, question)

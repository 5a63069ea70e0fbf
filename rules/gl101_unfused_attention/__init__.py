"""GL101 unfused-attention: softmax attention written by hand instead of the fused kernel."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

from torch import fx

from graphlint.capture import facts
from graphlint.files import is_installed_file, library_name
from graphlint.lines import SourceLine
from graphlint.memory.savings import attention_savings
from graphlint.ops import CAST, DROPOUT, MASK, MATMUL_LIKE, SCALE, SOFTMAX, VIEW, arg, is_static, matmul_operands, op, tensor_meta
from graphlint.ops import MAX_PATTERN_STEPS, MUL, row_max_shift
from graphlint.results import Severity
from graphlint.rule import Example, LazyFixer, Problem, Rule
from graphlint.tags import FUSABLE_ATTENTION_TAG
from graphlint.walk import DOWN, UP, chain, find, reach, reachable

# What may sit between the scores matmul and the softmax, and between the softmax and the values matmul;
# `scores[mask] = -inf` is recorded as a setitem.
_MASKS = MASK | {"setitem"}
_BETWEEN = SCALE | _MASKS | CAST | DROPOUT | VIEW
# Products of two activations; `addmm(bias, q, kᵀ)` adds a bias to the scores as it makes them.
_PRODUCTS = MATMUL_LIKE | {"addmm"}
_STEP_NAMES = [(SCALE, "scale"), (_MASKS, "mask"), (CAST, "cast"), (DROPOUT, "dropout")]


class UnfusedAttention(Rule):
    id = "GL101"
    name = "unfused-attention"
    severity = Severity.WARNING
    tags = ("performance", "attention", "memory", FUSABLE_ATTENTION_TAG)
    precision = "high"
    summary = "Softmax attention written by hand; torch.nn.functional.scaled_dot_product_attention runs it as one fused kernel."
    what = """
        A softmax that sits between two matrix products of activations: scores from `q @ k.transpose(-2, -1)`
        (or `torch.matmul`, `bmm`, `mm`, `baddbmm`, `addmm`, `einsum`), optionally scaled (`*` or `/`, before or after),
        masked (`+ mask`, `masked_fill`, `torch.where`, `scores[mask] = -inf`), cast, and passed through dropout,
        then a softmax over the last dimension, then a product with the values. It is found in the forward graph however it is
        spelled: across helper functions and files, in every layer (reported once per source line with the
        number of occurrences), and inside libraries such as `transformers` with `attn_implementation="eager"`.

        The finding points at the softmax call, the heart of the chain; the scores and values products, the
        scale, the mask and a dropout of the probabilities are related locations. When the attention runs in a
        library, the finding points at the line of your code that built or called it, and the library line is a
        related location.

        Not flagged: `F.scaled_dot_product_attention`, `nn.MultiheadAttention`, a softmax that is not between
        two products of activations (classifier heads, gating and mixture-of-experts weights computed against
        a weight matrix), a softmax over another dimension, linear attention without a softmax, and attention
        whose scores get a bias computed from the scores themselves (a contextual position bias such as CoPE,
        `sim = sim + self.cope(q, sim)`), which the fused call cannot compute. When some configurations of one
        line add such a bias and others do not, the finding counts only the others, and offers no fix.
    """
    why = """
        Written by hand, attention runs as several kernels and materialises the full
        batch × heads × seq × seq score and probability tensors, which autograd also keeps for backward. The
        fused kernel (Flash or memory-efficient attention) computes the same result in one kernel without
        storing those matrices: much less activation memory, and typically 2-5× faster forward and backward
        on GPUs. On the meta device and on some CPUs the fused call is lowered to the same matmuls, so
        graphlint judges what your code calls, not the kernels that ran.
    """
    example = """
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        scores = scores.masked_fill(causal_mask == 0, float("-inf"))
        probs = F.softmax(scores, dim=-1)
        probs = self.dropout(probs)
        out = probs @ v
    """
    instead = """
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout_p if self.training else 0.0, is_causal=True
        )

        # Hugging Face models:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    """
    fixes = """
        Safe, once proven: `--fix` rewrites hand-written attention as one `F.scaled_dot_product_attention(q, k, v,
        ...)` call in place of the product with the values, spelled with the file's own names for torch and
        `torch.nn.functional` (an import is added only when there is none), and deletes the statements that only
        fed it. The fix is built from what the rule matched in the graph: the products, the steps between them
        and every other use of the probabilities are handed to it as the source expressions they ran at, and a
        reading of the source that leads to another product than the graph ran (a branch not taken) is refused.
        `q @ k.transpose(-2, -1)` (also `matmul`, `bmm`, `k.transpose(2, 3)` of a 4-d key, a key variable
        transposed once, `baddbmm`/`addmm`, and `einsum` in any layout, with `q`, `k`, `v` and the result
        transposed or permuted into place) gives `q` and `k`; every `* s` or `/ d` on the scores, `q` or `k`
        (also under a reshape, also written `scores *= s`, or `q = q * self.scale` on a line of its own when
        nothing else reads the scaled `q`) becomes `scale=`, left out when it is the default
        (1/sqrt of the query's or key's own size, or an attribute or variable that can hold nothing but an
        inverse square root of something named as the head dimension, such as `head_dim ** -0.5`, and held the
        default in the graph), `scale=1.0` when there was none; `+ mask`
        (`scores += bias`) and a `baddbmm` bias with `beta=1` become `attn_mask=`, `masked_fill(c, -inf)` (also
        in place, `sim.masked_fill_(c, v)`, with the fill in a variable or `torch.full`) becomes `attn_mask=` the
        negation of `c`, `torch.where(c, scores, -inf)` becomes `attn_mask=c`, and a mask made from `tril`/`triu`
        of ones becomes `is_causal=True`. A mask under `if mask is not None:` becomes `attn_mask=mask`, one under
        `if flag:` `is_causal=flag` or `attn_mask=m if flag else None`; statements the `if` runs to prepare the
        mask stay in it, or are written into `attn_mask=` when they only made the mask or the fill. A scale after
        a -inf fill is kept (it leaves -inf as it is), and one after an additive mask scales the mask too
        (`attn_mask=mask / 4`). An added mask the forward makes with a dtype of its own (`torch.full((n, n),
        float("-inf")).triu(1)`, a cast, a tensor constant) is cast to the queries' dtype
        (`attn_mask=mask.to(q.dtype)`), since `scores + mask` promoted where the fused call would not (on the
        CPU it computes float64 queries with a float32 mask wrongly). Dropout on the probabilities becomes
        `dropout_p=p if self.training else 0.0`
        (or the flag the call passed as `training=`; an alpha dropout is left alone, since `dropout_p=` is an
        elementwise dropout); float32 upcasts around the softmax are dropped, also one
        under a flag (`if self.upcast_softmax: scores = scores.float()`), since the fused kernels accumulate in
        float32. Probabilities transposed on their way to a product with the values on
        the right (`torch.bmm(v, attn.permute(0, 2, 1))`) become the transpose of the fused call on `v`
        transposed. `scores.device` and `scores.dtype` read to build a bias become the query's.

        Spellings copied across model files: a mask added to the scores viewed in another shape and viewed back
        (BART, CLIP: `s = s.view(bsz, heads, tgt, src) + mask; s = s.view(bsz * heads, tgt, src)`) becomes
        `attn_mask=mask.expand(bsz, heads, tgt, src).reshape(bsz * heads, tgt, src)`; the same softmax ending
        both branches of an `if`/`else` whose `else` is the softmax alone (Swin) is read as the `if` followed by
        the softmax, and the whole `if`/`else` goes; boolean masks joined with `&` or `|` are passed as they
        are (never read as causal alone); a `baddbmm` bias and `beta` of 0 or 1 chosen in an `if`/`else`
        (diffusers, also in its `get_attention_scores` helper, whose `if self.upcast_attention:` casts of q and k
        to float32 are dropped like the softmax's) become that branch's bias, or None; biases summed in a loop
        over a list written out (OpenFold: `for b in [mask_bias, pair_bias]: a += b`) become their sum.
        Probabilities also read or changed only under flags the graph did not take (BART's `if layer_head_mask
        is not None:` and `if output_attentions:`, BLIP's `if self.save_attention:`) get a guarded fallback: the
        fused call under the complement of those flags (`if layer_head_mask is None and not output_attentions:`),
        the statements as written in its `else:`, so every case computes what it did.

        A finite fill (`-1e9`, `torch.finfo(dtype).min`) becomes an additive float mask, 0 where a key takes part
        and the fill elsewhere (`attn_mask=torch.where(keep, q.new_zeros(()), -1e9)`; a dtype's lowest number is
        written in the query's dtype, `torch.finfo(q.dtype).min`), and the fix is unsafe: on a row whose every
        key is masked the original spreads the weights evenly with no gradient to the scores, which no mask of
        the fused call reproduces (with the dtype's lowest number the outputs agree and the gradients do not;
        with `-1e9` the outputs differ too). A `-inf` fill gives the boolean mask, and a safe fix.

        The chain may run through the project's helpers, in the same file or another one: scores or a mask made
        by a method or function (`self._scores(q, k)`, `apply_mask(s, mask)`), or probabilities made by one
        (`probs = ops.attention_probs(q, k, scale, bias)`), are read as if written at the call, with the helper's
        parameters standing for what the call passes; the fused call goes where the values product is, and the
        helper is left as it is (other callers may use it). A helper whose other names (a module constant, an
        import) would mean something else at the call, or that the caller's file lacks, is left alone.

        For `transformers` models built with `from_config` or `from_pretrained`, the fix is
        `attn_implementation="sdpa"` on that call. A model class the installed `transformers` has no SDPA
        attention for (its `_supports_sdpa` is False, as DeBERTa-v2's) is reported without a fix, and the
        message says so: building it with `attn_implementation="sdpa"` raises.

        Unsafe: when the probabilities (or the scores) are also returned or stored after the values product
        (attention maps for visualisation, `qk.detach()`), the fused call cannot give them back; the fix is
        declared unsafe, puts `None` where they were returned or stored, and only `--unsafe-fixes` applies it.
        Also unsafe: a finite fill (above), and a chain that calls a submodule the fused call no longer calls,
        where the model as built shows that something could tell: a hook registered on it (an attention
        recorder's forward hook would stop firing), a subclass or a module of the project (its own forward
        would no longer run), parameters or buffers. A plain `nn.Dropout` (and its variants), `nn.Softmax` or
        `nn.Identity` with no hook is safe to stop calling; the fix reads the dropout's `p`
        (`dropout_p=self.attn_drop.p if self.training else 0.0`), and its message says the module is no longer
        called.

        Left alone, with the reason: two masks, a guard that also scales or casts the scores, probabilities used
        before the values product, an input reassigned between the statement that read it and the values
        product, a helper whose locals the fused call would need, scores reshaped between the products (other
        than to add a mask), a softmax in another branch than the scores, branches that end in different
        softmaxes or whose `else` also changes the scores, a mask added to a view with -1 in its shape, a list of
        biases whose items the source does not fix, and anything else on the way that the fused call cannot
        express. Every safe fix is proven on the model first; one that computes something else is refused.
    """
    bad_examples = (
        Example(
            title="nanoGPT-style causal self-attention in two layers",
            source='''
                import math
                import torch
                from torch import nn
                import torch.nn.functional as F


                class CausalSelfAttention(nn.Module):
                    def __init__(self, dim=32, heads=4, seq=16):
                        super().__init__()
                        self.heads = heads
                        self.qkv = nn.Linear(dim, 3 * dim)
                        self.proj = nn.Linear(dim, dim)
                        self.dropout = nn.Dropout(0.1)
                        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

                    def forward(self, x):
                        b, t, c = x.shape
                        q, k, v = self.qkv(x).split(c, dim=2)
                        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
                        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
                        att = F.softmax(att, dim=-1)  # expect: GL101
                        att = self.dropout(att)
                        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
                        return self.proj(y)


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.blocks = nn.ModuleList(CausalSelfAttention() for _ in range(2))

                    def forward(self, x):
                        for block in self.blocks:
                            x = x + block(x)
                        return x


                def make():
                    return Model(), (torch.randn(2, 16, 32),)
            ''',
            fixed='''
                import math
                import torch
                from torch import nn
                import torch.nn.functional as F


                class CausalSelfAttention(nn.Module):
                    def __init__(self, dim=32, heads=4, seq=16):
                        super().__init__()
                        self.heads = heads
                        self.qkv = nn.Linear(dim, 3 * dim)
                        self.proj = nn.Linear(dim, dim)
                        self.dropout = nn.Dropout(0.1)
                        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

                    def forward(self, x):
                        b, t, c = x.shape
                        q, k, v = self.qkv(x).split(c, dim=2)
                        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
                        y = F.scaled_dot_product_attention(
                            q, k, v, is_causal=True, dropout_p=self.dropout.p if self.training else 0.0
                        ).transpose(1, 2).contiguous().view(b, t, c)
                        return self.proj(y)


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.blocks = nn.ModuleList(CausalSelfAttention() for _ in range(2))

                    def forward(self, x):
                        for block in self.blocks:
                            x = x + block(x)
                        return x


                def make():
                    return Model(), (torch.randn(2, 16, 32),)
            ''',
        ),
        Example(
            title="einsum scores, torch.where mask, float32 softmax cast back",
            source='''
                import torch
                from torch import nn


                class Attention(nn.Module):
                    def __init__(self, dim=32):
                        super().__init__()
                        self.q = nn.Linear(dim, dim)
                        self.k = nn.Linear(dim, dim)
                        self.v = nn.Linear(dim, dim)

                    def forward(self, x, keep):
                        q, k, v = self.q(x), self.k(x), self.v(x)
                        scores = torch.einsum("bqd,bkd->bqk", q * q.shape[-1] ** -0.5, k)
                        scores = torch.where(keep, scores, float("-inf"))
                        probs = scores.softmax(-1, dtype=torch.float32).to(q.dtype)  # expect: GL101
                        return torch.bmm(probs, v)


                def make():
                    keep = torch.ones(2, 8, 8, dtype=torch.bool)
                    return Attention(), (torch.randn(2, 8, 32), keep)
            ''',
            fixed='''
                import torch
                from torch import nn


                class Attention(nn.Module):
                    def __init__(self, dim=32):
                        super().__init__()
                        self.q = nn.Linear(dim, dim)
                        self.k = nn.Linear(dim, dim)
                        self.v = nn.Linear(dim, dim)

                    def forward(self, x, keep):
                        q, k, v = self.q(x), self.k(x), self.v(x)
                        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)


                def make():
                    keep = torch.ones(2, 8, 8, dtype=torch.bool)
                    return Attention(), (torch.randn(2, 8, 32), keep)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="the same attention through the fused kernel",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class CausalSelfAttention(nn.Module):
                    def __init__(self, dim=32, heads=4):
                        super().__init__()
                        self.heads = heads
                        self.qkv = nn.Linear(dim, 3 * dim)
                        self.proj = nn.Linear(dim, dim)

                    def forward(self, x):
                        b, t, c = x.shape
                        q, k, v = self.qkv(x).split(c, dim=2)
                        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
                        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0, is_causal=True)
                        return self.proj(y.transpose(1, 2).reshape(b, t, c))


                def make():
                    return CausalSelfAttention(), (torch.randn(2, 16, 32),)
            ''',
        ),
        Example(
            title="nn.MultiheadAttention, a classifier head and mixture-of-experts gating",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self, dim=32, experts=4, classes=10):
                        super().__init__()
                        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
                        self.gate = nn.Parameter(torch.randn(dim, experts))
                        self.experts = nn.Parameter(torch.randn(experts, dim, dim))
                        self.head = nn.Linear(dim, classes)

                    def forward(self, x):
                        x, _ = self.attn(x, x, x)
                        weights = torch.softmax(x @ self.gate, dim=-1)
                        mixed = torch.einsum("bte,edf,btd->btf", weights, self.experts, x)
                        return torch.softmax(self.head(mixed.mean(1)), dim=-1)


                def make():
                    return Model(), (torch.randn(2, 8, 32),)
            ''',
        ),
    )

    def check(self, capture):
        order = {node: index for index, node in enumerate(capture.forward.nodes)}
        found, read_scores = [], {}
        for node in capture.ops:
            if op(node) in SOFTMAX and _over_last_dim(node):
                chain = _attention_chain(node)
                if chain is None:
                    continue
                bias = _bias_from_scores(chain[0], order)
                if bias is not None:  # the fused call cannot compute a bias from its own scores
                    read_scores.setdefault(_line(node), bias)
                    continue
                found.append((node, chain))
        # Layers that run the same lines get one rewrite: the mask is cast in all where any needs it (a later
        # layer's scores are made from what an earlier one did with the same mask).
        casts = {_line(node) for node, (before, _) in found if _mask_of_its_own_dtype(before)}
        for node, chain in found:
            problem = self._problem(node, *chain, capture=capture, mask_cast=_line(node) in casts)
            bias = read_scores.get(_line(node))
            if bias is not None:  # other configurations of this code add a bias made from the scores
                problem = dataclasses.replace(
                    problem, fix=partial(_refuse, f"other configurations of this code add a bias computed from the "
                                                  f"scores ({op(bias)} at line {_line(bias).line}), which the fused "
                                                  "call cannot compute"))
            yield problem

    def _problem(self, softmax: fx.Node, before: list[fx.Node], after: list[fx.Node], capture=None,
                 mask_cast: bool = False) -> Problem:
        scores, values = before[0], after[-1]
        steps = [op(scores)] + _step_names(before[1:]) + ["softmax"] + _step_names(after[:-1]) + [op(values)]
        advice = "use torch.nn.functional.scaled_dot_product_attention, which runs it as one fused kernel"
        meta = _meta(before[-1])
        fix = rewrite_attention.bound(rank=len(meta.shape) if meta is not None else None,
                                      default_scale=_scaled_by_default(scores, before[1:]), mask_cast=mask_cast)
        other = next((op(n) for n in after[:-1] if op(n) in DROPOUT and op(n) not in _ELEMENTWISE_DROPOUT), None)
        if other is not None:  # alpha or channel dropout: the fused call's dropout_p is neither
            fix = partial(_refuse, f"the probabilities pass through {other}, which the fused call's dropout_p (an "
                                   "elementwise dropout) does not compute in training")
        stack = facts(softmax).stack
        if stack and is_installed_file(stack[-1].file) and library_name(stack[-1].file) == "transformers":
            advice = 'build the model with attn_implementation="sdpa" to run it as one fused kernel'
            fix = use_sdpa_in_transformers
            # The model class that attn_implementation applies to: the outermost transformers model around it.
            built = next((m for m in facts(softmax).module_stack if m.supports_sdpa is not None), None)
            if built is not None and not built.supports_sdpa:
                advice = (f"transformers has no fused (sdpa) attention for {built.class_name} in the installed "
                          "version; a model class or a transformers version that has one runs it as one fused kernel")
                fix = partial(_refuse, f'{built.class_name} does not support attn_implementation="sdpa" in the '
                                       "installed transformers")
        related = [(scores, f"attention scores: {op(scores)}")]
        related += [(n, f"{name} of the scores") for n in before[1:] if (name := _step_name(n)) in ("scale", "mask")]
        # the dropout the fused call's dropout_p takes over: its line goes with the chain (and is priced with it)
        related += [(n, "dropout of the probabilities") for n in after if _step_name(n) == "dropout"]
        related.append((values, f"probabilities times values: {op(values)}"))
        return Problem(
            node=softmax,
            message=f"Hand-written softmax attention ({' → '.join(steps)}) in {{where}}{{occurrences}}; {advice}.",
            related=tuple(related),
            fix=fix,
            roles=_roles(softmax, before, after),
            saves_bytes=attention_savings(capture, (*before, softmax, *after), scores) if capture is not None else 0,
        )


def _roles(softmax: fx.Node, before: list[fx.Node], after: list[fx.Node]) -> tuple[tuple[str, fx.Node], ...]:
    """What the fix is built from (fix/match.py, a record without torch or libcst, which
    importing the fix package does not pull in): the two
    products, the steps between them by kind, and every other use of the probabilities, which the fused call
    cannot give back."""
    from .fix.match import AttentionMatch, Step

    chain = {softmax, *after}
    return AttentionMatch(
        scores=before[0],
        before=tuple(Step(_step_name(n) or "view", n) for n in before[1:]),
        softmax=softmax,
        after=tuple(Step(_step_name(n) or "layout", n) for n in after[:-1]),
        values=after[-1],
        elsewhere=tuple(user for n in (softmax, *after[:-1]) for user in n.users if user not in chain),
    ).to_roles()


def _scaled_by_default(scores: fx.Node, steps: list[fx.Node]) -> bool:
    """Whether the scores are multiplied by exactly 1/sqrt(head dim), the fused call's default scale, counting
    numbers the graph multiplied or divided them by (`* self.scale` reads as the number it held) and those on q or
    k in the product itself. False when any scale is a tensor, or the layout does not say which is the head dim."""
    if op(scores) in ("addmm", "baddbmm"):
        return False
    operands = matmul_operands(scores)
    meta = tensor_meta(operands[0]) if operands else None
    if meta is None or not meta.shape:
        return False
    head_dim = meta.shape[-1]
    if op(scores) == "einsum":  # the head dim is the one letter q and k share and the scores lack
        spec = scores.args[0] if scores.args and isinstance(scores.args[0], str) else ""
        inputs, _, out = spec.replace(" ", "").partition("->")
        parts = inputs.split(",")
        shared = [c for c in parts[0] if len(parts) == 2 and c in parts[1] and c not in out] if spec else []
        if len(shared) != 1 or "." in inputs or len(parts[0]) != len(meta.shape):
            return False
        head_dim = meta.shape[parts[0].index(shared[0])]
    value = 1.0
    # A scale on q or k just before the product counts too (`q = q * self.scale`): the fix folds it into `scale=`.
    for node in [*steps, *(o for o in operands if isinstance(o, fx.Node) and op(o) in SCALE)]:
        if op(node) not in SCALE:
            continue
        numbers = [a for a in node.args[:2] if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if len(numbers) != 1:
            return False
        if op(node) in MUL or op(node) == "mul_" or op(node) == "rmul":
            value *= numbers[0]
        elif node.args[1] is numbers[0] and numbers[0]:
            value /= numbers[0]
        else:
            return False
    return math.isclose(value, head_dim ** -0.5, rel_tol=1e-6)


def _bias_from_scores(before: list[fx.Node], order: dict[fx.Node, int]) -> fx.Node | None:
    """A step between the scores and the softmax that adds something computed from the scores themselves (a
    contextual position bias: `sim = sim + self.cope(q, sim)`), or None. Only nodes recorded after the scores
    product can depend on it, so the walk back stops at it."""
    chain = set(before)
    first = order.get(before[0], 0)
    for step, came_from in zip(before[1:], before, strict=False):
        if row_max_shift(step, came_from):  # the softmax ignores a shift by its row's maximum: not a bias
            continue
        others = [n for n in step.all_input_nodes if n is not came_from and n not in chain]
        # Past a node recorded before the scores product, nothing can depend on it: its inputs are older still.
        if next(find(others, UP, chain.__contains__, through=lambda n: order.get(n, -1) >= first), None):
            return step
    return None


_ADDED = {"add", "add_", "radd", "sub", "sub_", "rsub"}
_ELEMENTWISE_DROPOUT = {"dropout", "dropout_", "native_dropout"}


def _mask_of_its_own_dtype(before: list[fx.Node]) -> bool:
    """Whether a float mask added to the scores (or a `baddbmm` bias) comes, in part, from a tensor the forward
    made with a dtype of its own (`torch.full((n, n), float("-inf"))`, a tensor constant), not from the model's
    inputs, parameters or buffers: its dtype stays when the model runs in another, and the fused call needs it
    cast to the queries' dtype where `scores + mask` promoted."""
    # What the scores are made from follows the queries' dtype as far as the mask is concerned.
    upstream = reachable(before[0].all_input_nodes, UP, found=set(before))
    added = [n for step, came_from in zip(before[1:], before, strict=False)
             if op(step) in _ADDED and not row_max_shift(step, came_from)
             for n in step.all_input_nodes if n is not came_from and n not in upstream]
    if op(before[0]) == "baddbmm" and before[0].args and isinstance(before[0].args[0], fx.Node):
        added.append(before[0].args[0])

    def followed(node: fx.Node) -> bool:
        """Whether the mask may take its dtype from this value: a floating tensor (a boolean or integer one is not
        the mask's dtype), not one the scores follow, not an input or parameter (those follow the model's)."""
        return _floating(node) and node not in upstream and not (
            node.op == "placeholder" or node.op == "get_attr" and facts(node).is_parameter)

    return next(find(added, UP, lambda n: followed(n) and _own_dtype(n), through=followed), None) is not None


def _own_dtype(node: fx.Node) -> bool:
    """A constant tensor, a cast to a fixed dtype, or one made from numbers or a boolean mask (no floating input)."""
    return node.op == "get_attr" or op(node) in CAST or not [n for n in node.all_input_nodes if _floating(n)]


def _floating(node: fx.Node) -> bool:
    meta = tensor_meta(node)
    return meta is not None and getattr(meta.dtype, "is_floating_point", False)


def _line(node: fx.Node) -> SourceLine:
    stack = facts(node).stack
    return SourceLine.of(stack[-1]) if stack else SourceLine("", 0)


def _refuse(reason: str, site) -> str:
    """A fixer that declines with a reason the rule knows and the source does not show."""
    return reason


@LazyFixer
def rewrite_attention():
    """GL101's fix: one scaled_dot_product_attention call in place of the chain."""
    from .fix import rewrite_attention

    return rewrite_attention


@LazyFixer
def use_sdpa_in_transformers():
    """GL101's fix for a transformers model: attn_implementation="sdpa" where it is built."""
    from .fix import use_sdpa_in_transformers

    return use_sdpa_in_transformers


def _meta(node):
    """A node's shape and dtype; for `scores[mask] = v` (a setitem, which returns nothing), the tensor's."""
    return tensor_meta(chain(node, ("setitem",)).end)


def _over_last_dim(softmax: fx.Node) -> bool:
    """SDPA normalises over the key dimension, the last one; a softmax over another dimension is not attention."""
    meta = _meta(arg(softmax, 0, "input"))
    if meta is None:
        return False
    ndim = len(meta.shape)
    dim = arg(softmax, 1, "dim")
    if dim is None:  # F.softmax's legacy implicit dimension
        dim = 0 if ndim in (0, 1, 3) else 1
    return isinstance(dim, int) and ndim >= 2 and dim % ndim == ndim - 1


def _attention_chain(softmax: fx.Node) -> tuple[list[fx.Node], list[fx.Node]] | None:
    """(scores matmul … softmax's input, softmax's users … values matmul), or None when not attention."""
    before = _search(softmax, upstream=True)
    if before is None:
        return None
    after = _search(softmax, upstream=False)
    if after is None:
        return None
    return before, after


def _search(softmax: fx.Node, upstream: bool) -> list[fx.Node] | None:
    """Breadth-first through the ops allowed between, to the nearest matmul of two activations.

    Upstream the path is returned scores-first (excluding the softmax); downstream softmax-side first."""
    start = softmax.all_input_nodes[:1] if upstream else list(softmax.users)
    for step in reach(start, UP if upstream else DOWN, through=_BETWEEN, limit=MAX_PATTERN_STEPS):
        if op(step.node) in _PRODUCTS and _is_activation_product(step.node, step.came_from or softmax, upstream):
            path = step.path()
            return path[::-1] if upstream else path
    return None


def _is_activation_product(matmul: fx.Node, came_from: fx.Node, upstream: bool) -> bool:
    """Both sides are activations: a product with a weight matrix is a projection, not attention."""
    operands = matmul_operands(matmul)
    if len(operands) < 2 or any(o is None for o in operands):
        return False
    if upstream:
        return not any(is_static(o) for o in operands)
    # Downstream, the probabilities enter through `came_from`; the other operand must be the values.
    others = [o for o in operands if o is not came_from]
    return bool(others) and not any(is_static(o) for o in others)


def _step_name(node: fx.Node) -> str | None:
    for family, name in _STEP_NAMES:
        if op(node) in family:
            return name
    return None


def _step_names(nodes: list[fx.Node]) -> list[str]:
    names: list[str] = []
    for node in nodes:
        name = _step_name(node)
        if name and (not names or names[-1] != name):
            names.append(name)
    return names

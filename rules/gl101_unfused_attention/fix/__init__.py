"""GL101's fix: softmax attention written by hand in one function, rewritten as one
`F.scaled_dot_product_attention` call, or for `transformers` models, `attn_implementation="sdpa"`.

The rule hands over what it matched in the graph (whether dropout follows the softmax, the scores' rank); the
rewrite then reads the chain from the source, starting at the softmax the finding points at: backwards through
the statements that compute the scores (scales, one mask, casts, a mask under `if mask is not None:` or
`if flag:`) to the `q · kᵀ` product, and forwards through casts and dropout to the product with the values.
Each piece maps to one argument of the fused call:

- `q @ k.transpose(-2, -1)` (also `matmul`, `bmm`, `baddbmm`, an `einsum` in any layout) gives `q` and `k`,
  transposed or permuted into (batch..., sequence, head dim); any other right operand `kt` gives
  `kt.transpose(-2, -1)`, which is the same key;
- every `* s` and `/ d`, on the scores or on `q`/`k`, multiplies into `scale=`; no scale at all is `scale=1.0`,
  since the fused call's default is 1/sqrt(head dim);
- `+ m` is `attn_mask=m` (scaled with the scores when a scale follows it); `masked_fill(c, -inf)` is
  `attn_mask=` "not c" (the fused call's boolean mask says which positions take part); `torch.where(c, scores,
  fill)` is `attn_mask=c`; a mask built from `tril`/`triu` of ones is `is_causal=True`;
- dropout on the probabilities is `dropout_p=<p> if self.training else 0.0`; float32 upcasts are dropped
  (the fused kernels accumulate in float32 themselves).

The statements that only fed the chain are deleted. Probabilities also read after the values product
(returned or stored for visualisation) give an unsafe fix that puts None there. Anything else is left alone
with the reason: a chain across functions, two masks, an input reassigned between the scores and the values.
Whatever a safe rewrite produces is proven on the model before `--fix` writes it (graphlint.fix.prove), so a
mistake here is refused, never written.

What the rule matched arrives as one typed record (match.py, `AttentionMatch`); fixer.py runs the parts in
order. The parts, each a module of functions over one `Reading` (chain.py: its state and what every part reads):
scores.py walks back to the scores product, values.py forward to the values product, masks.py reads the mask,
checks.py decides whether the rewrite is exact, emit.py writes the call; implementation.py is the fix for
`transformers` models. Helpers the chain passes through are read with graphlint.rewrite.inline. Spellings copied
across model files have their own readers: views.py (a mask added to a view of the scores), chosen.py (a
`baddbmm` bias chosen in an `if`/`else`), loops.py (biases summed in a loop), branches.py (the same softmax
ending both branches of an `if`/`else`, read as one softmax after the `if`). Where the chain is refused
because the probabilities are also read or changed under flags the graph did not take, fallback.py gives the
fused call under the complement of those flags and keeps the statements as written in an `else:`.
"""

from __future__ import annotations

__all__ = ["rewrite_attention", "use_sdpa_in_transformers"]


def __getattr__(name: str):
    """The fixers, imported when a fix is asked for (the rule's LazyFixer loaders import them from here): the rule imports
    match.py from this package while it checks, and that must not import libcst."""
    if name == "rewrite_attention":
        from .fixer import rewrite_attention

        return rewrite_attention
    if name == "use_sdpa_in_transformers":
        from .implementation import use_sdpa_in_transformers

        return use_sdpa_in_transformers
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

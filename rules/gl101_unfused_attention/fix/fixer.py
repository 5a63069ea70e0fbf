"""GL101's fixer for hand-written attention, `rewrite_attention`: the order the parts run in (the package's
docstring says what each reads)."""

from __future__ import annotations

import libcst as cst

from .branches import softmax_in_both_branches
from .chain import Reading, anchor_at_the_values, softmax_input
from .checks import check_inputs_unchanged, check_matches_the_graph, check_names, trim_dels
from .emit import fused_call
from .fallback import guarded_fallback
from .masks import FILL_REASON, dtype_extreme, inline_setup
from .scores import fold_prescaled, walk_to_scores, zeros_for_added
from .values import walk_to_values
from graphlint.rewrite.contract import FixSite, Refused, Rewrite, code_of, dead_definitions
from graphlint.rewrite.source import inside
from graphlint.results import UNSAFE

def rewrite_attention(site: FixSite, rank: int | None = None, default_scale: bool = False,
                      mask_cast: bool = False) -> Rewrite | str:
    """The fused call in place of the product with the values, and the chain's statements deleted.

    The rule hands over what it matched in the graph as the site's roles (the products, the steps between them,
    other uses of the probabilities), the rank of the scores (so that `k.transpose(2, 3)` of a 4-d key is
    read as the transpose of its last two dimensions) and whether the numbers the graph scaled them by came to
    the fused call's default (so that `scale=self.scale` holding 1/sqrt(head dim) is left out), and whether an
    added mask's dtype can differ from the queries' (`mask_cast`: it was made in the forward with a dtype of its
    own, so the fused call gets it cast to the queries' dtype)."""
    try:
        reading = Reading(site, rank, default_scale, mask_cast)
        anchor_at_the_values(reading)
        branches = softmax_in_both_branches(reading)
        rewrite = _rewrite(reading)
        return branches.restored(rewrite) if branches is not None else rewrite
    except Refused as why:
        try:  # probabilities read under flags the capture did not take: the fused call where they are off
            return guarded_fallback(site, rank, default_scale, why, _rewrite, mask_cast)
        except Refused as reason:
            return str(reason)


def _rewrite(reading: Reading) -> Rewrite:
    """Read the chain (scores, values, masks), check it, and build the fused call that replaces it."""
    chain = reading.chain
    scores, statement = reading.start or (softmax_input(reading, reading.softmax), reading.softmax_statement)
    walk_to_scores(reading, scores, statement)
    walk_to_values(reading, reading.softmax, reading.softmax_statement)
    inline_setup(reading)
    fold_prescaled(reading)
    zeros_for_added(reading)
    check_matches_the_graph(reading)
    check_names(reading)
    check_inputs_unchanged(reading)
    callee, imports = reading.names.functional_call("scaled_dot_product_attention")
    call = fused_call(reading, callee)
    removed = tuple(s for s in dict.fromkeys(chain.consumed) if s is not chain.values_statement)
    # What only the deleted statements read goes too (`d_k = q.size(-1)` of a scale left out).
    removed += tuple(s for s in dead_definitions(reading.function, (*removed, chain.values_product), call)
                     if s not in removed)
    # A name renamed inside a statement that goes (`max_neg = -torch.finfo(sim.dtype).max`) goes with it.
    renamed = tuple(r for r in chain.renamed if not any(inside(r[0], s) for s in removed))
    deleted, trimmed = trim_dels(reading, call, removed)
    removed, renamed = removed + tuple(deleted), renamed + tuple(trimmed)
    fill = None
    if chain.fill is not None:
        # No mask of the fused call gives a fully masked row what a finite fill gave it (tests/test_fix_masks.py).
        outputs = "agree, its gradients do not" if dtype_extreme(chain.fill, reading.names) else "differ too"
        fill = FILL_REASON.format(fill=code_of(chain.fill), outputs=outputs)
    if chain.elsewhere:
        # The documented trade: the weights are no longer computed, so what read them gets None.
        shown = ", ".join(dict.fromkeys(f"`{code_of(n)}`" for n in chain.elsewhere))
        return Rewrite(chain.values_product, call,
                       f"hand-written attention → {callee}(...); {shown} returned or stored as None" +
                       (f"; {fill}" if fill else ""), removed=removed, imports=imports,
                       also=(*renamed, *((n, cst.Name("None")) for n in chain.elsewhere)), applicability=UNSAFE)
    if fill is not None:
        return Rewrite(chain.values_product, call, f"hand-written attention → {callee}(...); {fill}", removed=removed,
                       imports=imports, also=renamed, applicability=UNSAFE)
    return Rewrite(chain.values_product, call, f"hand-written attention → {callee}(...)", removed=removed,
                   imports=imports, also=renamed)

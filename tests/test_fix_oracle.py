"""The proof against an oracle: every fix the rule examples and the suite's fix models produce (GL101's tables,
GL106's, GL201's), run original and fixed in plain PyTorch, with nothing of graphlint's, at float64 and float32
(and bfloat16 where the model runs in it), on the factory's inputs and on a fully masked row and a sequence of
length one (the inputs the proof adds). The proof's verdict must match: proven means the oracle finds the same
results in every dtype (no false "same"), a difference found means the oracle finds one too (no false
"differs")."""

from __future__ import annotations

import importlib.util
import itertools
import textwrap
from pathlib import Path

import pytest
import torch

import test_fix_attention
import test_fix_attention_copies
import test_fix_dtypes
import test_fix_norm_spellings
import test_fix_observable
import test_fix_safety
import test_fix_spellings
import test_gl201_fix
from conftest import proving_session, write
from graphlint.engine import load_rules
from graphlint.rewrite.edits import apply_edits
from graphlint.project import Project
from graphlint.results import SAFE, UNSAFE


def _models() -> dict[str, str]:
    """Every fix model's source, by a name saying where it comes from."""
    models = {}
    for rule in load_rules():
        for index, example in enumerate(e for e in rule.bad_examples if e.fixed):
            models[f"example_{rule.id}_{index}"] = textwrap.dedent(example.code)
    for case, (forward, _) in test_fix_attention.FORMS.items():
        models[f"forms_{case}"] = test_fix_attention._source(forward)
    for case, (source, _) in test_fix_attention_copies.FIXED.items():
        models[f"copies_{case}"] = test_fix_attention_copies.HEADER + textwrap.dedent(source).lstrip("\n")
    for table in (test_fix_spellings.ATTENTION, test_fix_spellings.GUARDS_AND_LAYOUTS):
        for case, (source, *_) in table.items():
            models[f"spellings_{case}"] = textwrap.dedent(test_fix_spellings.ATTENTION_HEADER + source.lstrip("\n"))
    for style in test_fix_observable.STYLES:
        models[f"observable_{style}"] = test_fix_observable._source(style)
    models["observable_hooked"] = test_fix_observable._source(
        "minGPT", test_fix_observable.HOOKS["forward"].format(module="attn_drop"))
    for name, mask in (("own", test_fix_dtypes.OWN_DTYPE), ("queries", test_fix_dtypes.QUERIES_DTYPE)):
        models[f"dtypes_{name}"] = test_fix_dtypes.EAGER.replace("MASK", mask)
    for name, fill in (("finite", "-1e9"), ("lowest", "-torch.finfo(sim.dtype).max"), ("infinite", 'float("-inf")')):
        models[f"fills_{name}"] = test_fix_safety.PERCEIVER.replace("FILL", fill)
    for name, softmax in (("module", "self.attend(dots)"), ("functional", "F.softmax(dots, dim=-1)")):
        models[f"softmax_{name}"] = test_fix_safety.HOOKED.replace("SOFTMAX", softmax)
    for case, (source, _) in test_gl201_fix.FIXED.items():
        models[f"gl201_{case}"] = source
    for case, (_, source, *_) in test_fix_norm_spellings.FIXED.items():
        source = textwrap.dedent(source).lstrip("\n")
        models[f"norms_{case}"] = source if source.startswith(("import", "from")) else \
            test_fix_norm_spellings.HEADER + source
    return {_file_name(name): source for name, source in models.items()}


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).lower()


# -- the oracle: plain PyTorch -------------------------------------------------------------------------------

_COUNTER = itertools.count()


def _build(path: Path):
    spec = importlib.util.spec_from_file_location(f"oracle_{path.stem}_{next(_COUNTER)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    made = module.make()
    model, args = made[0], tuple(made[1])
    kwargs = dict(made[2]) if len(made) > 2 and made[2] else {}
    return model, args, kwargs


def _floats(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _floats(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _floats(v)]
    return [t for v in vars(value).values() for t in _floats(v)] if hasattr(value, "__dict__") else []


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _run(model, args, kwargs, dtype):
    """Outputs and parameter gradients (None when the backward raises: then outputs alone are compared)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    outputs = model(*_cast(args, dtype), **_cast(kwargs, dtype))
    floats = _floats(outputs)
    # Each output weighted at random, the same weights on both sides: a plain sum would make the gradients of a
    # softmax's output zero in exact arithmetic, rounding noise that no comparison can read.
    weights = torch.Generator().manual_seed(2)
    try:
        sum((t.double() * torch.randn(t.shape, generator=weights, dtype=torch.float64)).sum()
            for t in floats if t.requires_grad).backward()
        grads = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    except (RuntimeError, AttributeError):  # nothing requires grad, or the original's in-place write (GL201)
        grads = None
    return [t.detach().double() for t in floats], grads


def _gap(a: torch.Tensor, b: torch.Tensor, defined: torch.Tensor | None = None, scale: float | None = None) -> float:
    """How far apart, relative to the size of the original's values (or to `scale`: a gradient that is zero in
    exact arithmetic, such as a key bias's, is rounding noise next to the others)."""
    if a.shape != b.shape:
        return float("inf")
    if defined is not None:
        a, b = a[defined], b[defined]
    if a.numel() == 0:
        return 0.0
    if (a.isnan() != b.isnan()).any():
        return float("inf")
    a, b = a.nan_to_num(), b.nan_to_num()
    return ((a - b).abs().max() / ((a.abs().max() if scale is None else scale) + 1e-6)).item()


def _inputs(args, kwargs):
    """The factory's inputs, each boolean argument with its first row all False and all True, and every input cut
    to a sequence of length one (as the proof's, written again here)."""
    yield "factory", args, kwargs
    tensors = [(i, t) for i, t in enumerate(args) if isinstance(t, torch.Tensor)]
    for index, tensor in [(i, t) for i, t in tensors if t.dtype == torch.bool and t.dim() >= 1][:2]:
        for value in (False, True):
            forced = tensor.clone()
            forced[(0,) * (tensor.dim() - 1)] = value
            yield f"row {value}", (*args[:index], forced, *args[index + 1:]), kwargs
    first = next((t for _, t in tensors if t.dim() >= 2), None)
    if first is not None:
        length, batch = first.shape[2 if first.dim() == 4 else 1], first.shape[0]
        if length > 1:
            def cut(value):
                if not isinstance(value, torch.Tensor):
                    return value
                for dim in range(0 if length != batch else 1, value.dim()):
                    if value.shape[dim] == length:
                        value = value.narrow(dim, 0, 1)
                return value.clone()
            yield "length one", tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}


# Same below the first bound, different above the second, relative to the values' size; between: ambiguous.
BOUNDS = {torch.float64: (1e-5, 1e-3), torch.float32: (1e-4, 1e-2), torch.bfloat16: (1e-1, 1e-1)}


def oracle(original: Path, fixed: Path) -> tuple[str, str]:
    """("same" | "differs" | "fails" | "ambiguous", what was seen)."""
    model, args, kwargs = _build(original)
    try:
        rewritten, _, _ = _build(fixed)
        rewritten.load_state_dict(model.state_dict(), strict=True)
    except Exception as error:
        return "fails", f"the fixed model does not build or load: {error}"
    worst = "same", ""
    for dtype, (same, differs) in BOUNDS.items():
        for name, call_args, call_kwargs in _inputs(args, kwargs):
            if dtype != torch.float64 and name != "factory":
                continue  # the edge cases in float64, as the proof runs them
            try:
                before = _run(model.to(dtype).eval(), call_args, call_kwargs, dtype)
            except Exception:
                continue  # the original does not run this way (bfloat16, a cut sequence): nothing to compare
            try:
                after = _run(rewritten.to(dtype).eval(), call_args, call_kwargs, dtype)
            except Exception as error:
                return "fails", f"{dtype} {name}: the fixed model raises {type(error).__name__}"
            edge = name != "factory"
            gaps = [_gap(a, b, ~a.isnan() if edge else None) for a, b in itertools.zip_longest(before[0], after[0])
                    if a is not None and b is not None] + ([float("inf")] if len(before[0]) != len(after[0]) else [])
            undefined = edge and before[1] is not None and any(g.isnan().any() for g in before[1].values())
            if before[1] is not None and not undefined:
                if after[1] is None or before[1].keys() != after[1].keys():
                    gaps.append(float("inf"))
                else:
                    scale = max((g.abs().max().item() for g in before[1].values() if g.numel()), default=0.0)
                    gaps += [_gap(before[1][n], after[1][n], scale=scale) for n in before[1]]
            gap = max(gaps, default=0.0)
            if gap > differs:
                return "differs", f"{dtype} {name}: {gap:.3g}"
            if gap > same:
                worst = "ambiguous", f"{dtype} {name}: {gap:.3g}"
    return worst


# -- the proof against it ------------------------------------------------------------------------------------

MODELS = _models()
# The mask fills are one table of one right and two wrong fills, proven together: both verdicts must occur in it.
FILLS = sorted(name for name in MODELS if name.startswith("fills_"))


@pytest.fixture(scope="module")
def parent():
    """One warm parent for the module's proofs, in each worker: it forks the children, and costs a warm-up."""
    from graphlint.run.parent import WarmParent

    return WarmParent()


# One test per model, so that pytest-xdist spreads them over the workers.
@pytest.mark.proof
@pytest.mark.parametrize("name", sorted(set(MODELS) - set(FILLS)))
def test_the_proof_agrees_with_a_plain_pytorch_oracle_on_every_fix_of_the_suite(tmp_path, parent, name):
    _proof_against_the_oracle(tmp_path, parent, [name])


@pytest.mark.proof
def test_the_proof_agrees_with_the_oracle_on_a_right_and_two_wrong_mask_fills(tmp_path, parent):
    verdicts = _proof_against_the_oracle(tmp_path, parent, FILLS)
    # Both verdicts occur in the table, so the comparison means something either way.
    assert any(ok for ok, _, _ in verdicts.values()) and any(differs for _, differs, _ in verdicts.values())


def _proof_against_the_oracle(tmp_path, parent, names: list[str]) -> dict[str, tuple[bool, bool, str]]:
    """Lints the models, proves each fix found and runs the oracle on it; fails on any disagreement. The verdicts,
    by finding: (proven, a difference found, what the oracle saw)."""
    from graphlint.fix.prove import prove
    from graphlint.pipeline import COMPILE_TAG
    from graphlint.session import check
    from graphlint.config import Config

    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    for name in names:
        write(tmp_path, f"{name}.py", MODELS[name])
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    # Every rule that can write a fix: the torch.compile rules write none, and their analysis costs a dynamo run.
    rules = tuple(sorted({rule.id for rule in load_rules() if COMPILE_TAG not in rule.tags}))
    report = check([str(tmp_path / f"{name}.py:make") for name in names], project,
                   Config(device="cpu", select=rules), parent=parent)
    assert not report.errors, report.errors[:3]
    fixes = [f for f in report.all_findings if f.fix is not None and f.fix.applicability in (SAFE, UNSAFE)]
    assert len(fixes) >= len(names)  # each model has at least one fix
    prover = proving_session(project, tmp_path, parent)
    disagreements, verdicts = [], {}
    for finding in fixes:
        [result] = [r for r in report.results if r.target in finding.targets]
        verdict = prove(result, [finding], project, tmp_path, report.all_findings, prover)
        path = Path(finding.location.path)
        fixed = write(tmp_path / "fixed" / f"{path.stem}_{finding.rule_id}_{finding.location.line}", path.name,
                      apply_edits(path.read_text(encoding="utf-8"), finding.fix.edits))
        seen, why = oracle(path, fixed)
        where = f"{path.name}:{finding.location.line} {finding.rule_id}"
        verdicts[where] = (verdict.ok, verdict.differs, seen)
        if verdict.ok and seen != "same":
            disagreements.append(f"{where}: proven, but the oracle finds it {seen} ({why})")
        elif verdict.differs and seen != "differs":
            disagreements.append(f"{where}: the proof found a difference ({verdict.reason}), the oracle {seen} ({why})")
        elif not verdict.ok and not verdict.runs and seen != "fails":
            disagreements.append(f"{where}: the proof found the fix fails ({verdict.reason}), the oracle {seen}")
        elif seen == "differs" and not verdict.differs:
            disagreements.append(f"{where}: the oracle finds a difference ({why}), the proof did not ({verdict.reason})")
    counts = {kind: sum(1 for v in verdicts.values() if v[2] == kind) for kind in ("same", "differs", "fails")}
    print(f"{len(verdicts)} fixes of {len(names)} models; oracle: {counts}; proven: "
          f"{sum(1 for v in verdicts.values() if v[0])}, differs: {sum(1 for v in verdicts.values() if v[1])}")
    assert not disagreements, "\n".join(disagreements)
    return verdicts


def test_the_oracle_tells_a_wrong_rewrite_from_a_right_one(tmp_path):
    """The oracle itself, on a rewrite known right (the cast mask) and one known wrong in float64 only (the
    float32 mask beside float64 queries) of the same model."""
    source = test_fix_dtypes.EAGER.replace("MASK", test_fix_dtypes.OWN_DTYPE)
    chain = source[source.index("        scores = torch.matmul"):source.index("\n\n\ndef make")]
    original = write(tmp_path, "original.py", source)
    right = write(tmp_path / "right", "model.py", source.replace(
        chain, "        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))"))
    wrong = write(tmp_path / "wrong", "model.py", source.replace(
        chain, "        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)"))
    assert oracle(original, right)[0] == "same"
    seen, why = oracle(original, wrong)
    if not test_fix_dtypes.float32_mask_is_wrong():
        pytest.skip("this torch computes a float32 mask with float64 queries right: both rewrites are")
    assert seen == "differs" and why.startswith("torch.float64 factory"), why

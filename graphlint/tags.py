"""The tags that tell the layers below the rules what a rule reads besides the capture, so that the pipeline, the
process layer and the result cache decide by a rule's tags, never by its ID. No torch here: the cache reads them
on its path that imports none."""

# Rules with this tag read `Capture.compiled`: the torch.compile analysis runs only when one of them is selected.
COMPILE_TAG = "torch.compile"
RECOMPILE_TAG = "recompile"  # ...and these run the model on more calls than the factory's inputs
# Rules with this tag read `Capture.memory`: the training step is measured only when one runs and a budget is set.
BUDGET_TAG = "memory-budget"
# Rules with this tag read `Capture.longer_sequence`: the step runs again at a longer sequence only for them.
LONGER_TAG = "sequence-length"
# The rule with this tag reports the suppression comments that hide no finding of the run: the policy stage,
# which alone sees every target's findings and comments, makes those findings under that rule's ID.
UNUSED_SUPPRESSION_TAG = "unused-suppression"
# Rules with this tag find attention written by hand that one fused kernel runs: `graphlint graph` lists their
# findings as what could be fused.
FUSABLE_ATTENTION_TAG = "fusable-attention"

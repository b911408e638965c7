"""Own work timed inside a wrapper (attribution/detectors/straggler/vocab.py): a user who times
Megatron's schedule as `forward-backward` with `forward-compute`, `backward-compute`,
`batch-generator` and the p2p waits inside it (the step timer nests them:
`forward-backward/forward-compute`) has the nested compute scored, not dropped with the wrapper
that holds no work of its own; nested under own work or an unknown section, a part stays its
parent's. The whole job is the campaign's user-megatron rows (rules/campaign.yaml)."""

from __future__ import annotations

import pytest

from faultlens.attribution.detectors.straggler.vocab import load_vocabulary


@pytest.mark.parametrize(
    ("names", "scored"),
    [
        (
            [
                "forward-backward",
                "forward-backward/batch-generator",
                "forward-backward/forward-recv",
                "forward-backward/forward-compute",
                "forward-backward/backward-compute",
                "forward-backward/backward-send",
                "all-grads-sync",
                "optimizer",
            ],
            [
                "forward-backward/batch-generator",
                "forward-backward/forward-compute",
                "forward-backward/backward-compute",
                "optimizer",
            ],
        ),
        # the wrapper under another name Megatron uses, on the GPU's timeline too
        (
            ["train-step", "train-step/forward", "train-step/backward", "train-step/optimizer"],
            ["train-step/forward", "train-step/backward", "train-step/optimizer"],
        ),
        # under own work the part stays its parent's; under an unknown namespace too
        (["forward", "forward/attn", "forward/recv", "backward"], ["forward", "backward"]),
        (["model", "model/forward", "optimizer"], ["optimizer"]),
    ],
)
def test_own_work_nested_in_a_wrapper_is_scored(names, scored):
    chosen, classes = load_vocabulary().scored(names)
    assert chosen == scored
    assert not any(
        classes[n].kind.own_work for n in names if n in ("forward-backward", "train-step")
    )

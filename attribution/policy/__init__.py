"""The decision policy: one incident -> exactly one decision (failover, escalate, notify or drain),
by the rules of rules/policy.yaml (docs/design.md "Decision policy").

Order of evaluation:
1. software repeats found in the job's history (the same fingerprint on other nodes, or again at the
   same step after a restart) -> escalate as software;
2. no certain culprit (no culprit node, or confidence below the threshold) -> escalate;
3. the first matching rule gives the action;
4. a failover must pass the hard guards: never for a never-failover cause (a software bug is never
   restarted in a loop), never more nodes than max_exclude_nodes, and the job's retry budget for the
   root cause must not be spent; the job's lemon nodes are excluded along with the culprits; the
   restore is chosen by the checkpoint catalog (a RestoreChooser) given the exclusions and, for
   corruption causes, the time and step of the first signal.

The store's history comes in through the PolicyHistory protocol (StoreHistory reads the incidents,
decisions and ranks tables); the restore choice through the RestoreChooser callable
(controller/checkpoints implements it).

Modules: config (rules/policy.yaml's model, PolicyConfig and its rules, the loader), history
(PolicyHistory, NoHistory, StoreHistory, LemonNode), decide (DecisionPolicy, RestoreRequest,
RestoreChooser), slowdown (what a slowdown's decision may do), running (what the supervisor asks:
does a decision keep the job running, may a slowdown stop it).
"""

from faultlens.attribution.policy.config import (
    DEFAULT_POLICY_PATH,
    LemonRule,
    PolicyConfig,
    PolicyError,
    PolicyFile,
    PolicyRule,
    SoftwareRepeatRule,
    load_policy,
    policy_from_document,
)
from faultlens.attribution.policy.decide import DecisionPolicy, RestoreChooser, RestoreRequest
from faultlens.attribution.policy.history import LemonNode, NoHistory, PolicyHistory, StoreHistory

__all__ = [
    "DEFAULT_POLICY_PATH",
    "DecisionPolicy",
    "LemonNode",
    "LemonRule",
    "NoHistory",
    "PolicyConfig",
    "PolicyError",
    "PolicyFile",
    "PolicyHistory",
    "PolicyRule",
    "RestoreChooser",
    "RestoreRequest",
    "SoftwareRepeatRule",
    "StoreHistory",
    "load_policy",
    "policy_from_document",
]

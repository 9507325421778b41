"""Schemathesis hooks for tests/schemathesis/run.sh.

What JSON Schema cannot say about a request, mapped onto schema-valid requests only (never onto
negative ones, whose point is to break the rules):

- a participant name must be one this coordinator is configured with (422 unknown_participant):
  that is deployment data, not part of the contract, so names are mapped onto the cluster's
  (TWOPC_ST_PARTICIPANTS, set by run.sh);
- the participants of a transaction, and the steps of a saga, are unique by name (422
  duplicate_participant), where `uniqueItems` can only require whole items to differ.

Nothing else is changed: every other field is what Schemathesis generated.
"""

import os

import schemathesis
from schemathesis.core.parameters import ParameterLocation

POOL = [name for name in os.environ.get("TWOPC_ST_PARTICIPANTS", "").split(",") if name]


def _positive_body(case):
    meta = case.meta
    return (
        meta is not None
        and ParameterLocation.BODY in meta.components
        and not meta.is_negative_at(ParameterLocation.BODY)
        and isinstance(case.body, dict)
    )


@schemathesis.hook
def map_case(context, case):
    if not POOL or not _positive_body(case):
        return case
    operation = (case.operation.method.upper(), case.operation.path)
    body = case.body
    if operation == ("POST", "/v1/transactions") and isinstance(body.get("participants"), list):
        # Distinct configured names, as many as the pool has.
        parts = [p for p in body["participants"] if isinstance(p, dict)][: len(POOL)]
        for part, name in zip(parts, POOL):
            part["name"] = name
        body["participants"] = parts
    elif operation == ("POST", "/v1/sagas") and isinstance(body.get("steps"), list):
        steps = [s for s in body["steps"] if isinstance(s, dict)]
        names = [s.get("name") for s in steps]
        for i, step in enumerate(steps):
            step["participant"] = POOL[i % len(POOL)]
            if len(set(names)) != len(names):
                step["name"] = f"step-{i}"
    elif operation == ("POST", "/v1/transactions/{id}/resolve") and isinstance(
        body.get("participants"), list
    ):
        body["participants"] = [POOL[i % len(POOL)] for i in range(len(body["participants"]))]
    return case

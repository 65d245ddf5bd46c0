#!/usr/bin/env python3
"""Evaluates a ValidatingAdmissionPolicy against admission requests offline,
in the order the API server does: matchConstraints.resourceRules, then
matchConditions (all true, or the policy does not apply), then variables,
then each validation (all true, or the request is denied with its
message). An expression that fails to evaluate denies under
failurePolicy: Fail, as it does in the API server.

The CEL is evaluated by cel-python (celpy, a pure-Python CEL
implementation), not by the API server's cel-go: standard CEL only (has(),
macros, `in`, the ternary); the Kubernetes CEL libraries are not there, and
the policy uses none. The request, object and oldObject are JSON as the API
server hands them to CEL: fields that are empty are absent (omitempty).

Usage: admission_policy.py POLICY.yaml CASES.json
  POLICY.yaml: YAML documents, the first ValidatingAdmissionPolicy is used.
  CASES.json: [{"name", "request", "object", "oldObject"}, ...], request as
  an AdmissionRequest: operation, resource {group, version, resource},
  subResource, userInfo {username, extra}.
Prints a JSON list: {"name", "matched", "allowed", "message"} per case.
"""
import json
import sys

import celpy
import yaml  # PyYAML, a dependency of kubernetes-validate
from celpy import celtypes


def main() -> int:
    policy_path, cases_path = sys.argv[1:3]
    with open(policy_path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    policy = next(d for d in docs if d.get("kind") == "ValidatingAdmissionPolicy")
    with open(cases_path) as f:
        cases = json.load(f)
    compiled = Compiled(policy["spec"])
    print(json.dumps([compiled.admit(case) for case in cases], indent=1))
    return 0


class Compiled:
    def __init__(self, spec: dict):
        unsupported = {"paramKind", "auditAnnotations"} & spec.keys()
        constraints = spec.get("matchConstraints", {})
        unsupported |= {"excludeResourceRules", "namespaceSelector", "objectSelector"} & {
            k for k, v in constraints.items() if v
        }
        if unsupported:
            raise SystemExit(f"not evaluated here: {sorted(unsupported)}")
        self.fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
        self.rules = constraints.get("resourceRules", [])
        self.env = celpy.Environment()
        self.conditions = [(c["name"], self.program(c["expression"]))
                           for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], self.program(v["expression"]))
                          for v in spec.get("variables", [])]
        self.validations = []
        for v in spec.get("validations", []):
            if "messageExpression" in v:
                raise SystemExit("messageExpression is not evaluated here")
            message = v.get("message", f"failed expression: {v['expression'].strip()}")
            self.validations.append((message, self.program(v["expression"])))

    def program(self, expression: str):
        return self.env.program(self.env.compile(expression))

    def matches(self, request: dict) -> bool:
        resource = request["resource"]
        name = resource["resource"]
        if request.get("subResource"):
            name += "/" + request["subResource"]

        def within(value, allowed):
            return "*" in allowed or value in allowed

        return any(
            within(request["operation"], rule.get("operations", []))
            and within(resource.get("group", ""), rule.get("apiGroups", []))
            and within(resource["version"], rule.get("apiVersions", []))
            and within(name, rule.get("resources", []))
            for rule in self.rules
        )

    def admit(self, case: dict) -> dict:
        result = {"name": case["name"], "matched": False, "allowed": True, "message": None}
        if not self.matches(case["request"]):
            return result
        activation = {
            "request": celpy.json_to_cel(case["request"]),
            "object": celpy.json_to_cel(case.get("object")),
            "oldObject": celpy.json_to_cel(case.get("oldObject")),
        }
        try:
            for name, program in self.conditions:
                if not truth(program.evaluate(activation), f"matchCondition {name}"):
                    return result
            result["matched"] = True
            variables = celtypes.MapType()
            activation["variables"] = variables
            for name, program in self.variables:
                variables[celtypes.StringType(name)] = program.evaluate(activation)
            for message, program in self.validations:
                if not truth(program.evaluate(activation), message):
                    result.update(allowed=False, message=message)
                    return result
        except (celpy.CELEvalError, TypeError, ValueError) as e:
            result.update(matched=True, allowed=not self.fail_closed,
                          message=f"expression error: {e}")
        return result


def truth(value, what: str) -> bool:
    """A CEL result that must be a boolean (an error value raises)."""
    if isinstance(value, celpy.CELEvalError):
        raise value
    if not isinstance(value, celtypes.BoolType):
        raise TypeError(f"{what}: not a boolean: {value!r}")
    return bool(value)


if __name__ == "__main__":
    sys.exit(main())

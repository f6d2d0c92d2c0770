#!/usr/bin/env python3
"""Validates documents against schemas for tests/test_json_schema.cpp: reads JSON lines
{"schema": ..., "doc": ...} and checks each doc with python3-jsonschema (the validator the schema's
$schema names, Draft 2020-12 by default), formats included. Prints each invalid one and a summary line
"N valid of M"; exits 1 when any is invalid."""
import json
import sys

import jsonschema

n = n_valid = 0
for line in open(sys.argv[1], encoding="utf-8"):
    case = json.loads(line)
    n += 1
    cls = jsonschema.validators.validator_for(case["schema"], default=jsonschema.Draft202012Validator)
    errors = list(cls(case["schema"], format_checker=cls.FORMAT_CHECKER).iter_errors(case["doc"]))
    if errors:
        print("INVALID", json.dumps(case["doc"]), "against", json.dumps(case["schema"]), ":", errors[0].message)
    else:
        n_valid += 1
print(f"{n_valid} valid of {n}")
sys.exit(0 if n_valid == n else 1)

"""Checks deployment files against AWS API models, offline: botocore's service models
(the ones the AWS CLI validates its input with), from the LocalStack venv that
tests/tools/install.sh installs. Used by tests/e2e/tests/deploy.rs.

  aws_api_shape.py ecs-task-definition FILE
      FILE is valid input of ECS RegisterTaskDefinition (`aws ecs
      register-task-definition --cli-input-json file://FILE`): required members, no
      unknown member, types, lengths and ranges (botocore's validator), and every enum
      value one the model lists (which botocore leaves to the service). Prints each
      problem; exit status 1 when there is one.
  aws_api_shape.py operations SERVICE
      The service's operation names, in the SDKs' snake_case (put_metric_data), one a line.
"""

import json
import sys

import botocore.session
from botocore import xform_name
from botocore.validate import ParamValidator


def enum_errors(value, shape, path):
    """Enum values the model does not list, anywhere in `value`."""
    errors = []
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                errors += enum_errors(member, shape.members[name], f"{path}.{name}")
    elif shape.type_name == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            errors += enum_errors(item, shape.member, f"{path}[{i}]")
    elif shape.type_name == "map" and isinstance(value, dict):
        for key, item in value.items():
            errors += enum_errors(item, shape.value, f"{path}.{key}")
    elif shape.type_name == "string" and shape.enum and value not in shape.enum:
        errors.append(f"{path}: {value!r} is not one of {shape.enum}")
    return errors


def main(argv):
    session = botocore.session.get_session()
    if len(argv) == 3 and argv[1] == "ecs-task-definition":
        shape = session.get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape
        with open(argv[2]) as f:
            params = json.load(f)
        report = ParamValidator().validate(params, shape)
        problems = [report.generate_report()] if report.has_errors() else []
        problems += enum_errors(params, shape, "taskDefinition")
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    if len(argv) == 3 and argv[1] == "operations":
        for name in session.get_service_model(argv[2]).operation_names:
            print(xform_name(name))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

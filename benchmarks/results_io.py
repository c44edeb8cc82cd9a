"""What every benchmark does with its results: write them as JSON (creating the folder)."""
import json
import os


def write_json(path: str, result) -> None:
    """Write `result` to `path` as indented JSON."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)

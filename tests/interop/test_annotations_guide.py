"""docs/guides/annotations-and-catalog.md runs as written against the shipped samples:
every Python block, in order, on one server, and each `# …` line under a print is what
that print shows."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "annotations-and-catalog.md"


def test_every_block_runs_and_prints_what_it_says(start_server, capsys):
    server = start_server(ROOT / "samples")
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 2
    namespace = {}
    expected = []
    for i, code in enumerate(blocks):
        assert "grpc://127.0.0.1:8815" in code or i > 0
        code = code.replace("grpc://127.0.0.1:8815", server.location)
        exec(compile(code, f"{GUIDE}:python-block-{i}", "exec"), namespace)
        expected += re.findall(r"^# (.*)$", code, re.M)
    printed = capsys.readouterr().out.splitlines()
    assert printed == expected

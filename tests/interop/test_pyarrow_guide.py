"""docs/guides/pyarrow.md's example runs as written against the shipped samples and
reads the bytes numpy reads from the file."""
import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "pyarrow.md"


def test_guide_example_reads_the_sample_bit_exact(start_server, capsys):
    server = start_server(ROOT / "samples")
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert blocks, "the guide has a python block"
    code = blocks[0]
    assert "grpc://127.0.0.1:8815" in code
    namespace = {}
    exec(compile(code.replace("grpc://127.0.0.1:8815", server.location), str(GUIDE), "exec"), namespace)
    expected = np.load(ROOT / "samples" / "zstack.npy")
    stack = namespace["stack"]
    assert stack.dtype == expected.dtype and stack.shape == expected.shape
    assert stack.tobytes() == expected.tobytes()
    printed = capsys.readouterr().out
    # What the guide says the prints show is what they show.
    for line in re.findall(r"^# (.*)$", code, re.M):
        assert line in printed, (line, printed)


def test_a_bare_array_id_as_command_is_refused_with_the_path_form(start_server):
    import pyarrow.flight as flight
    import pytest

    server = start_server(ROOT / "samples")
    client = flight.connect(server.location)
    with pytest.raises(flight.FlightError, match=r'for_path\("zstack"\)'):
        client.get_flight_info(flight.FlightDescriptor.for_command(b"zstack"))

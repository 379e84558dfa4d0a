"""docs/guides/napari.md's recipe runs as written, without a display: it builds the
multiscale list from the advertised pyramid, and every level reads back as numpy's strided
pick of the sample's bytes."""
import ast
import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "napari.md"
LOCATION = "grpc://127.0.0.1:8815"


def blocks():
    found = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(found) == 2, "the guide has the recipe and the napari lines"
    return found


def run_recipe(server, array_id="zstack"):
    code = blocks()[0]
    assert LOCATION in code and '"zstack"' in code
    code = code.replace(LOCATION, server.location).replace('"zstack"', f'"{array_id}"')
    namespace = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    return namespace


def test_the_recipe_prints_what_the_guide_says(start_server, capsys):
    server = start_server(ROOT / "samples")
    namespace = run_recipe(server)
    assert namespace["rgb"] is False
    printed = capsys.readouterr().out.strip()
    assert printed == "[(24, 256, 256)] False"
    assert "`[(24, 256, 256)]`" in GUIDE.read_text()
    levels = namespace["levels"]
    np.testing.assert_array_equal(levels[0].compute(), np.load(ROOT / "samples" / "zstack.npy"))


def test_every_advertised_level_reads_back(start_server, tmp_path):
    config = tmp_path / "tessera.toml"
    config.write_text("[pyramid]\nplane_max_pixels = 5000\npixel_budget_cubic_root = 24\n")
    server = start_server(ROOT / "samples", extra=("--config", str(config)))
    for array_id, colour in (("zstack", False), ("rgb", True)):
        namespace = run_recipe(server, array_id)
        assert namespace["rgb"] is colour, array_id
        want = np.load(ROOT / "samples" / f"{array_id}.npy")
        desc, levels = namespace["desc"], namespace["levels"]
        assert len(levels) >= 2, f"{array_id}: the config makes computed levels"
        for lv, level in zip(desc.pyramid, levels):
            expected = want[tuple(slice(None, None, s) for s in lv.scale_hint)]
            np.testing.assert_array_equal(np.asarray(level.compute()), expected)


def test_the_napari_lines_use_only_what_the_recipe_made():
    tree = ast.parse(blocks()[1])
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert used - {"napari", "viewer"} == {"levels", "len", "rgb"}

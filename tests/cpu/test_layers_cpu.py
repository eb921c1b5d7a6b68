"""The layer rules of docs/design.md, checked on the package's sources (tools/layers.py): imports
run down the floors, no import circle, no import inside a function (optional dependencies
excepted), no private name taken from another module, no library file over the line limit."""

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("layers", Path(__file__).resolve().parents[2] / "tools" / "layers.py")
layers = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(layers)


def test_every_module_has_a_floor():
    mods = layers.module_files()
    assert mods and all(layers.floor_of(m) >= 0 for m in mods)


def test_layer_rules_hold(capsys):
    rc = layers.main()
    out = capsys.readouterr().out
    assert rc == 0, out
    for line in ("upward imports: 0", "imports inside functions: 0", "private names taken from another module: 0",
                 "import circles: 0", "layer check: PASS"):
        assert line in out, out


def test_the_check_catches_an_upward_import_and_a_circle(tmp_path, monkeypatch):
    """A fake package with a floor-0 module importing a floor-1 module that imports it back: the
    check reports the upward import and the circle (so the rules cannot pass vacuously)."""
    pkg = tmp_path / "cutegemm"
    (pkg / "runtime").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "__init__.py").write_text("")
    (pkg / "config.py").write_text("from .runtime import device\n")
    (pkg / "runtime" / "device.py").write_text("from .. import config\n\n\ndef f():\n    import os\n")
    monkeypatch.setattr(layers, "ROOT", pkg)
    mods = layers.module_files()
    edges, in_function, private = layers.scan(mods)
    upward = [(m, t) for m, ts in edges.items() for t in ts if layers.floor_of(t) > layers.floor_of(m)]
    assert ("cutegemm.config", "cutegemm.runtime.device") in upward
    assert layers.circles(edges) == [["cutegemm.config", "cutegemm.runtime.device"]]
    assert [(m, t) for m, _, t in in_function] == [("cutegemm.runtime.device", "os")]
    assert layers.main() == 1

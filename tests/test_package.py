"""The package itself: imports and runs without torchaudio (the reference, dev-only) and pyiceberg (optional)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import make_shards


def test_library_works_without_torchaudio_and_pyiceberg(tmp_path):
    make_shards(tmp_path, [6], "ipc_file", batch_rows=3, seconds=0.3)
    script = textwrap.dedent(f"""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torchaudio", "pyiceberg"):
                    raise ImportError(name + " is blocked in this test")

        sys.meta_path.insert(0, Block())
        import audioloader as al
        from audioloader import nodes  # noqa: F401
        features = al.MelSpectrogramConfig(sample_rate=8000, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)
        with al.AudioLoader({str(tmp_path)!r}, batch_size=3, train=False, features=features) as loader:
            batches = list(loader)
        assert sum(len(b["index"]) for b in batches) == 6
        assert "torchaudio" not in sys.modules and "pyiceberg" not in sys.modules
        try:
            al.ShardDataset(al.IcebergTable("audio.clips"))
            raise SystemExit("an IcebergTable without pyiceberg raised nothing")
        except ImportError as error:
            assert "pip install 'pyiceberg[sql-sqlite]'" in str(error), error
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_public_names_are_importable():
    import audioloader as al
    from audioloader.nodes import ArrowShardReader, Batcher, DecodeSpectrogram, ShuffleBuffer

    for name in ("AudioLoader", "MelSpectrogramConfig", "CheckpointMismatchError", "DecodeError", "SchemaError",
                 "ShardWriter", "Loader"):
        assert hasattr(al, name), name
    assert all(callable(node) for node in (ArrowShardReader, Batcher, DecodeSpectrogram, ShuffleBuffer))

"""Without PyAV (the ``[ffmpeg]`` extra): the library imports and works, and a row only FFmpeg reads is a bad row
whose reason names the extra. Runs whether or not PyAV is installed (``import av`` is made to fail here)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa

import audioloader as al
from tests.helpers import clip_bytes, write_ipc_file

#: The first bytes of an M4A (an ISO ``ftyp`` box) and of a WebM (the EBML header): sniffed as containers only
#: FFmpeg reads, whatever follows.
M4A_HEAD = b"\x00\x00\x00\x18ftypM4A \x00\x00\x02\x00M4A isom" + bytes(256)
WEBM_HEAD = b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01" + bytes(256)
INSTALL = 'pip install "audioloader-arrow[ffmpeg]"'


def test_without_pyav_an_m4a_or_webm_row_is_a_bad_row_naming_the_extra(tmp_path, monkeypatch):
    audio = [clip_bytes(0), M4A_HEAD, clip_bytes(2, fmt="FLAC"), WEBM_HEAD]
    table = pa.table({"audio": pa.array(audio, pa.binary()), "label": pa.array(range(4), pa.int64())})
    shard = write_ipc_file(tmp_path / "rows.arrow", table)
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError, as where it is not installed
    options = {"batch_size": 2, "train": False, "features": al.WaveformConfig(sample_rate=16000),
               "length": al.LengthPolicy(clip_seconds=0.25), "workers": al.Workers(num_workers=2, kind="thread")}
    with al.AudioLoader(shard, **options) as loader:
        labels = [int(x) for batch in loader for x in batch["label"] if x >= 0]  # -1: padding of a batch
        stats = loader.stats()
    assert labels == [0, 2]  # libsndfile's rows still decode
    reasons = {bad["row"]: bad["reason"] for bad in stats["bad_rows"]}
    assert set(reasons) == {1, 3}
    assert all(INSTALL in reason for reason in reasons.values()), reasons
    assert "MP4/M4A" in reasons[1] and "Matroska/WebM" in reasons[3]


def test_the_library_imports_without_pyav():
    code = ("import sys; sys.modules['av'] = None\n"
            "import audioloader as al, audioloader.dsp.ffmpeg, audioloader.dsp.audio\n"
            "assert al.Source('x/', decoder='ffmpeg').decoder == 'ffmpeg'\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

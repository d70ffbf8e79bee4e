#!/usr/bin/env bash
# Fill a folder with the wheels scripts/gpu_check.sh (and scripts/gpu_campaign.sh through it) installs on the GPU host,
# which has no network and whose python3 (3.12) has torch but no tritonclient or pytriton (docs/serve.md#gpu-check).
# Run it where PyPI is reachable:
#
#   scripts/gpu_wheels.sh [--all] [DIR]        # default DIR: .cache/gpu-wheels (git-ignored)
#
# By default only what the lent GPU machines' image lacks (seen on the H200, 2026-12-04): nvidia-pytriton,
# tritonclient, python-rapidjson, pytz, simpy and numpy 1.26.4 (~40 MB); --all adds packaging, pandas,
# python-dateutil, tzdata, six and psutil for a host without them (~51 MB). Without --all those six are removed from
# DIR, so that what a device run carries stays small (scripts/gpu_campaign.sh --size).
# numpy 1.26.4 is included because the bundled python backend (Triton 2.51) needs numpy<2 in the stub: with numpy 2
# an output tensor arrives with its shape but no bytes (seen with python 3.12 + numpy 2.5 here).
# To keep the folder small enough to travel with the working tree (carry allows 64 MiB in all), wheels over 1 MB are
# recompressed with LZMA and two are slimmed (files removed, RECORD rewritten, nothing added or changed):
# tritonclient loses its perf_analyzer/perf_client binaries, and nvidia-pytriton its python-backend stubs for Pythons
# other than 3.12 and the libpython 3.13 only the 3.13 stub links. Pins match setup.cfg where the package is ours.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ALL=0
if [ "${1:-}" = "--all" ]; then ALL=1; shift; fi
DIR="${1:-$REPO/.cache/gpu-wheels}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
LENT=(nvidia-pytriton==0.7.0 tritonclient==2.50.0 python-rapidjson==1.25 numpy==1.26.4 pytz==2026.6 simpy==4.1.2)
HOST=(packaging==26.4 pandas==2.3.3 python-dateutil==2.9.0.post0 tzdata==2026.6 six==1.17.0 psutil==7.2.2)
WANTED=("${LENT[@]}")
if [ "$ALL" = 1 ]; then
  WANTED+=("${HOST[@]}")
else
  for spec in "${HOST[@]}"; do  # the image has these: left out of what travels
    rm -f "$DIR/$(echo "${spec%%==*}" | tr - _)"-*.whl
  done
fi
mkdir -p "$DIR"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$DIR" "${WANTED[@]}"
"$PY" - "$DIR" <<'PYEOF'
import pathlib, re, sys, zipfile

folder = pathlib.Path(sys.argv[1])


def repack(wheel: pathlib.Path, drop=lambda name: False) -> None:
    """Rewrite ``wheel`` LZMA-compressed (pip reads it with zipfile) without the members ``drop(name)`` selects,
    RECORD updated. A wheel already in LZMA is left as it is, so a second run does not redo the work."""
    with zipfile.ZipFile(wheel) as src:
        if src.infolist()[0].compress_type == zipfile.ZIP_LZMA:
            return
        names = src.namelist()
        dropped = {n for n in names if drop(n)}
        tmp = wheel.with_name(wheel.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as out:
            for name in names:
                if name in dropped:
                    continue
                data = src.read(name)
                if name.endswith(".dist-info/RECORD"):
                    data = "".join(line + "\n" for line in data.decode().splitlines()
                                   if line.split(",")[0] not in dropped).encode()
                out.writestr(src.getinfo(name), data, compress_type=zipfile.ZIP_LZMA)
    tmp.replace(wheel)
    print(f"{wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB" + (f", {len(dropped)} unused files dropped" if dropped else ""))


def slim(pattern: str, drop) -> None:
    repack(next(folder.glob(pattern)), drop)


# perf_analyzer / perf_client binaries: the GPU check does not run them
slim("tritonclient-2.50.0-*.whl", lambda n: "/data/bin/" in n)
# python-backend stubs for other Pythons than 3.12, and the libpython 3.13 only the 3.13 stub links
slim("nvidia_pytriton-0.7.0-*.whl", lambda n: bool(re.match(r"pytriton/tritonserver/python_backend_stubs/(?!3\.12/)", n))
     or bool(re.match(r"nvidia_pytriton\.libs/libpython3-[^/]*\.13\.so", n)))
for big in sorted(folder.glob("*.whl")):
    if big.stat().st_size > 1_000_000:
        repack(big)
PYEOF
du -sh "$DIR"
ls "$DIR"

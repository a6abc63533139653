#!/usr/bin/env bash
# LiteRT's Arm64 CPU kernels on an x86-64 Linux machine, for `edgevit check --arm`
# and `edgevit bench --arm`:
#   - Debian bookworm's qemu-user (7.2): only its dynamic qemu-aarch64 binary, which
#     loads TCG plugins (the static one does not), and the few libraries it needs
#     that a Debian host may lack; and its qemu-x86_64, which runs this machine's own
#     Python and LiteRT as an older x86 CPU (AVX2, SSE4) would (edgevit/litert/x86_levels.py:
#     XNNPACK's x86 int8 kernels differ by CPU);
#   - an arm64 userland of Debian packages unpacked with dpkg-deb (no chroot, no
#     root): python3.11 with numpy 1.24 and libc's symbol names (libc6-dbg);
#   - the ai-edge-litert 1.4.0 aarch64 wheel (the newest Linux aarch64 build of
#     LiteRT) unpacked into its site-packages;
#   - insn_regions, edgevit's instruction-counting plugin (scripts/arm-emulator/),
#     compiled against the qemu-plugin.h of the same Debian qemu source.
# Everything goes into one folder, $EDGEVIT_ARM_HOME (default ~/.cache/edgevit-arm,
# about 140 MB once installed, 90 MB more while it runs), with apt's own state there
# too: the machine's apt setup, architectures and packages stay as they are, and
# root is not needed.
# Needs: apt-get and dpkg-deb (Debian or Ubuntu), gcc, python3 with pip, network
# access to Debian's archive and PyPI.
# Idempotent: a second run checks the installation and exits in about a second;
# a change of this script's pins or of the plugin source rebuilds what changed.
# Any failing step prints one `install-arm-emulator: error: ...` line, exit 1.
set -uo pipefail

LITERT_VERSION="1.4.0"
SUITE="bookworm"
MIRROR="http://deb.debian.org/debian"
SECURITY_MIRROR="http://deb.debian.org/debian-security"
QEMU_HOST_PACKAGES=(libcapstone4 libnuma1 liburing2)
ROOTFS_PACKAGES=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3-numpy libc6 libc6-dbg
                 libexpat1 zlib1g libffi8 libblas3 liblapack3 libgfortran5 libgcc-s1 libstdc++6)
LAYOUT=2   # bump when the folder layout changes

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PLUGIN_SOURCE="$HERE/arm-emulator/insn_regions.c"
ARM_HOME="${EDGEVIT_ARM_HOME:-$HOME/.cache/edgevit-arm}"
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"

say() { echo "install-arm-emulator: $*"; }
fail() { echo "install-arm-emulator: error: $*" >&2; exit 1; }
# run a step quietly; on failure print its last line of output as the reason
quiet() {
    local what="$1"; shift
    local log
    log="$("$@" 2>&1)" || fail "$what: $(printf '%s\n' "$log" | grep -v '^\s*$' | tail -n 1)"
}

[ "$(uname -m)" = "x86_64" ] || fail "this installer is for x86-64 Linux hosts (this is $(uname -m))"
for tool in apt-get apt-cache dpkg-deb gcc tar xz; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool not found (it needs a Debian/Ubuntu host with gcc and xz-utils)"
done
[ -n "$PYTHON" ] || fail "python3 not found"
[ -f "$PLUGIN_SOURCE" ] || fail "plugin source $PLUGIN_SOURCE is missing (run this script from an edgevit checkout)"

STAMP="layout=$LAYOUT litert=$LITERT_VERSION suite=$SUITE packages=${ROOTFS_PACKAGES[*]} plugin=$(sha256sum "$PLUGIN_SOURCE" | cut -c1-16)"
if [ -f "$ARM_HOME/manifest.json" ] && [ "$(cat "$ARM_HOME/.stamp" 2>/dev/null)" = "$STAMP" ] \
        && [ -x "$ARM_HOME/qemu/qemu-aarch64" ] && [ -x "$ARM_HOME/qemu/qemu-x86_64" ] \
        && [ -x "$ARM_HOME/rootfs/usr/bin/python3.11" ] \
        && [ -f "$ARM_HOME/plugin/libinsn_regions.so" ]; then
    say "already installed in $ARM_HOME"
    exit 0
fi
mkdir -p "$ARM_HOME" 2>/dev/null || fail "cannot create $ARM_HOME"
rm -f "$ARM_HOME/manifest.json" "$ARM_HOME/.stamp"

# --- apt, with its own state in $ARM_HOME/apt ------------------------------------
APT_DIR="$ARM_HOME/apt"
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/archives/partial" "$APT_DIR/preferences.d" "$APT_DIR/debs" \
    || fail "cannot create $APT_DIR"
: > "$APT_DIR/status"
cat > "$APT_DIR/sources.list" <<EOF
deb [arch=amd64,arm64] $MIRROR $SUITE main
deb [arch=amd64,arm64] $MIRROR $SUITE-updates main
deb [arch=amd64,arm64] $SECURITY_MIRROR $SUITE-security main
deb-src $MIRROR $SUITE main
deb-src $MIRROR $SUITE-updates main
deb-src $SECURITY_MIRROR $SUITE-security main
EOF
cat > "$APT_DIR/apt.conf" <<EOF
Dir::State "$APT_DIR";
Dir::State::lists "$APT_DIR/lists";
Dir::State::status "$APT_DIR/status";
Dir::Cache "$APT_DIR";
Dir::Cache::archives "$APT_DIR/archives";
Dir::Etc::SourceList "$APT_DIR/sources.list";
Dir::Etc::SourceParts "$APT_DIR/sources.list.d";
Dir::Etc::Preferences "$APT_DIR/preferences";
Dir::Etc::PreferencesParts "$APT_DIR/preferences.d";
APT::Architecture "amd64";
APT::Architectures { "amd64"; "arm64"; };
Acquire::Languages "none";
APT::Sandbox::User "root";
EOF
[ "$(id -u)" = "0" ] || sed -i '/APT::Sandbox::User/d' "$APT_DIR/apt.conf"
export APT_CONFIG="$APT_DIR/apt.conf"

say "reading Debian $SUITE's package lists (amd64, arm64, sources) into $APT_DIR"
quiet "apt-get update (Debian $SUITE package lists)" apt-get update -qq

version_of() { apt-cache show "$1" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1; }
QEMU_VERSION="$(version_of qemu-user:amd64)"
[ -n "$QEMU_VERSION" ] || fail "qemu-user:amd64 is not in Debian $SUITE's package lists"
# qemu-user may be a binNMU (+bN): the source version is on its Source: line
QEMU_SOURCE_VERSION="$(apt-cache show qemu-user:amd64 | sed -n 's/^Source: qemu (\(.*\))$/\1/p' | head -n 1)"
QEMU_SOURCE_VERSION="${QEMU_SOURCE_VERSION:-$QEMU_VERSION}"

# --- download ---------------------------------------------------------------------
say "downloading qemu-user $QEMU_VERSION and the arm64 userland"
wanted=(qemu-user:amd64)
for p in "${QEMU_HOST_PACKAGES[@]}"; do wanted+=("$p:amd64"); done
for p in "${ROOTFS_PACKAGES[@]}"; do wanted+=("$p:arm64"); done
rm -f "$APT_DIR"/debs/*.deb
(cd "$APT_DIR/debs" && quiet "apt-get download ${wanted[*]}" apt-get download -qq "${wanted[@]}") || exit 1

say "downloading the ai-edge-litert $LITERT_VERSION aarch64 wheel"
mkdir -p "$ARM_HOME/wheels"
quiet "pip download ai-edge-litert==$LITERT_VERSION (aarch64 wheel)" "$PYTHON" -m pip download -q --no-deps \
    --only-binary=:all: --platform manylinux_2_17_aarch64 --python-version 3.11 --implementation cp --abi cp311 \
    -d "$ARM_HOME/wheels" "ai-edge-litert==$LITERT_VERSION"
WHEEL="$(ls "$ARM_HOME"/wheels/ai_edge_litert-"$LITERT_VERSION"-*aarch64*.whl 2>/dev/null | head -n 1)"
[ -n "$WHEEL" ] || fail "pip download gave no ai_edge_litert $LITERT_VERSION aarch64 wheel"

say "downloading Debian's qemu $QEMU_SOURCE_VERSION source (for the plugin header)"
SRC_DIR="$ARM_HOME/qemu-source"
rm -rf "$SRC_DIR" && mkdir -p "$SRC_DIR"
(cd "$SRC_DIR" && quiet "apt-get source --download-only qemu=$QEMU_SOURCE_VERSION" \
    apt-get source -qq --download-only "qemu=$QEMU_SOURCE_VERSION") || exit 1

# --- unpack into staging folders, then move into place ---------------------------------
STAGE="$ARM_HOME/.staging"
rm -rf "$STAGE" && mkdir -p "$STAGE/qemu/lib" "$STAGE/rootfs" "$STAGE/unpack" "$STAGE/include" || fail "cannot create $STAGE"
deb_of() { ls "$APT_DIR"/debs/"$1"_*_"$2".deb 2>/dev/null | head -n 1; }

say "unpacking"
deb="$(deb_of qemu-user amd64)"
[ -n "$deb" ] || fail "qemu-user's package was not downloaded"
QEMUS=(qemu-aarch64 qemu-x86_64)
quiet "unpack ${QEMUS[*]} from $(basename "$deb")" \
    bash -c "dpkg-deb --fsys-tarfile '$deb' | tar -x -C '$STAGE/unpack' ${QEMUS[*]/#/./usr/bin/}"
for q in "${QEMUS[@]}"; do mv "$STAGE/unpack/usr/bin/$q" "$STAGE/qemu/$q"; done
for p in "${QEMU_HOST_PACKAGES[@]}"; do
    deb="$(deb_of "$p" amd64)"
    [ -n "$deb" ] || fail "$p's package was not downloaded"
    quiet "unpack $(basename "$deb")" dpkg-deb -x "$deb" "$STAGE/unpack"
done
cp -a "$STAGE"/unpack/usr/lib/x86_64-linux-gnu/*.so* "$STAGE/qemu/lib/" || fail "no libraries in ${QEMU_HOST_PACKAGES[*]}"
for q in "${QEMUS[@]}"; do
    missing="$(LD_LIBRARY_PATH="$STAGE/qemu/lib" ldd "$STAGE/qemu/$q" 2>&1 | sed -n 's/^\s*\(\S*\) => not found.*/\1/p' | tr '\n' ' ')"
    [ -z "$missing" ] || fail "$q needs libraries this machine lacks: ${missing% } (Debian: apt-get install libglib2.0-0 libgnutls30)"
done

for p in "${ROOTFS_PACKAGES[@]}"; do
    deb="$(deb_of "$p" arm64)"
    [ -n "$deb" ] || fail "$p:arm64's package was not downloaded"
    quiet "unpack $(basename "$deb")" dpkg-deb -x "$deb" "$STAGE/rootfs"
done
ROOT="$STAGE/rootfs"
# dpkg's maintainer scripts never ran: make the links they would have made, and
# make no link point outside the userland (qemu -L resolves absolute links on the host)
LIBDIR="$ROOT/usr/lib/aarch64-linux-gnu"
ln -sf blas/libblas.so.3 "$LIBDIR/libblas.so.3" && ln -sf lapack/liblapack.so.3 "$LIBDIR/liblapack.so.3" \
    || fail "cannot link libblas/liblapack"
find "$ROOT" -type l -lname '/*' -delete
# empty loader cache and preload list: the guest's loader must not read the host's
mkdir -p "$ROOT/etc" && : > "$ROOT/etc/ld.so.cache" && : > "$ROOT/etc/ld.so.preload"
SITE="$ROOT/usr/local/lib/python3.11/dist-packages"
mkdir -p "$SITE"
quiet "unpack $(basename "$WHEEL")" "$PYTHON" -m zipfile -e "$WHEEL" "$SITE"

# --- the plugin -----------------------------------------------------------------------
say "building the instruction-counting plugin"
ORIG="$(ls "$SRC_DIR"/qemu_*.orig.tar.* 2>/dev/null | head -n 1)"
[ -n "$ORIG" ] || fail "Debian's qemu source tarball was not downloaded"
quiet "extract qemu-plugin.h from $(basename "$ORIG")" \
    tar -x -f "$ORIG" -C "$STAGE/unpack" --wildcards '*/include/qemu/qemu-plugin.h'
HEADER="$(find "$STAGE/unpack" -name qemu-plugin.h | head -n 1)"
[ -n "$HEADER" ] || fail "qemu-plugin.h not found in $(basename "$ORIG")"
cp "$HEADER" "$STAGE/include/"
mkdir -p "$STAGE/plugin"
quiet "compile $PLUGIN_SOURCE" gcc -O2 -Wall -Werror -Wno-unused-parameter -shared -fPIC \
    -I "$STAGE/include" -o "$STAGE/plugin/libinsn_regions.so" "$PLUGIN_SOURCE" -lpthread

# --- into place, then check that it runs -------------------------------------------------
rm -rf "$ARM_HOME/qemu" "$ARM_HOME/rootfs" "$ARM_HOME/plugin" "$ARM_HOME/include" "$ARM_HOME/pycache"
mv "$STAGE/qemu" "$STAGE/rootfs" "$STAGE/plugin" "$STAGE/include" "$ARM_HOME/" || fail "cannot move files into $ARM_HOME"
rm -rf "$STAGE" "$SRC_DIR"

say "checking: arm64 Python imports numpy and ai_edge_litert, the plugin counts, x86 emulation runs"
CHECK_OUT="$(mktemp)"
guest() {
    # the guest writes its bytecode under pycache/ (never into the host's folders)
    env -i PATH=/usr/bin:/bin LANG=C.UTF-8 LD_LIBRARY_PATH="$ARM_HOME/qemu/lib" \
        "$ARM_HOME/qemu/qemu-aarch64" -U LD_LIBRARY_PATH -L "$ARM_HOME/rootfs" -cpu cortex-a76 "$@"
}
quiet "run the arm64 Python under qemu-aarch64" guest \
    -plugin "$ARM_HOME/plugin/libinsn_regions.so,out=$CHECK_OUT" \
    "$ARM_HOME/rootfs/usr/bin/python3.11" -E -s -X "pycache_prefix=$ARM_HOME/pycache" -c "
import ctypes, json, numpy
from ai_edge_litert import interpreter
call = ctypes.CDLL(None).syscall
call.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong]
call(0xE7E7, 0x65646765, 1); sum(range(1000)); call(0xE7E7, 0x65646765, 2); call(0xE7E7, 0x65646765, 3)
"
grep -q '^regions 1$' "$CHECK_OUT" && grep -q '^block ' "$CHECK_OUT" \
    || fail "the plugin loaded but counted no marked region (see $CHECK_OUT)"
rm -f "$CHECK_OUT"
HOST_PYTHON="$("$PYTHON" -c 'import sys; print(sys.executable)')"  # the interpreter itself, not a shim script
quiet "run this machine's Python under qemu-x86_64 as an AVX2 CPU" \
    env LD_LIBRARY_PATH="$ARM_HOME/qemu/lib" "$ARM_HOME/qemu/qemu-x86_64" -U LD_LIBRARY_PATH -cpu Haswell-noTSX \
    "$HOST_PYTHON" -c "import numpy"

pkg_version() { dpkg-deb -f "$(deb_of "$1" "$2")" Version; }
cat > "$ARM_HOME/manifest.json" <<EOF
{
  "layout": $LAYOUT,
  "litert": "$LITERT_VERSION",
  "qemu": "$QEMU_VERSION",
  "python": "$(pkg_version python3.11-minimal arm64)",
  "numpy": "$(pkg_version python3-numpy arm64)",
  "libc": "$(pkg_version libc6 arm64)",
  "suite": "$SUITE"
}
EOF
echo "$STAMP" > "$ARM_HOME/.stamp"
rm -rf "$APT_DIR" "$ARM_HOME/wheels"  # about 90 MB of lists and downloads, not needed to run
say "installed in $ARM_HOME (LiteRT $LITERT_VERSION aarch64, qemu-user $QEMU_VERSION)"

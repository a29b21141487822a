#!/usr/bin/env bash
# Local machine: vLLM 0.26.0's _C library (.device-engine-so/c.xz, made by
# ../shared/device/make-engine-bundle) in two pieces, for a working tree that with the whole of
# .device-engine-so passes the 64 MiB a device call takes. Writes .device-engine-so-1/ and
# .device-engine-so-2/ (excluded from git), each a piece and a stage.sh. On the GPU machine,
# back to back (a machine idle for 30 s goes back), instead of .device-engine-so/stage.sh:
#   call 1a: bash .device-engine-so-1/stage.sh     carry .device-engine-so-1
#   call 1b: bash .device-engine-so-2/stage.sh     carry .device-engine-so-2
# the second joins the pieces, checks their digest and unpacks _C to /tmp/gdn-engine, as
# .device-engine-so/stage.sh does; then scripts/h200_engine_stage.sh moe and deps as usual.
set -euo pipefail
source=.device-engine-so/c.xz
[ -f $source ] || { echo "no $source: run ../shared/device/make-engine-bundle first" >&2; exit 1; }
sum=$(sha256sum $source | cut -d' ' -f1)
rm -rf .device-engine-so-1 .device-engine-so-2
mkdir -p .device-engine-so-1 .device-engine-so-2
split -n 2 -d -a 2 $source .device-engine-so-1/cpart.
mv .device-engine-so-1/cpart.01 .device-engine-so-2/
for i in 1 2; do
  grep -qx "/.device-engine-so-$i/" .git/info/exclude 2>/dev/null \
    || echo "/.device-engine-so-$i/" >> .git/info/exclude
done
cat > .device-engine-so-1/stage.sh <<'EOS'
#!/usr/bin/env bash
# Piece 1 of 2 of vLLM 0.26.0's _C library: kept beside the engine's folder for piece 2.
set -e
parts=${GDN_ENGINE_ROOT:-/tmp/gdn-engine}-so-parts
mkdir -p $parts && cp "$(dirname "$0")"/cpart.* $parts/
ls -la $parts
EOS
cat > .device-engine-so-2/stage.sh <<EOS
#!/usr/bin/env bash
# Piece 2 of 2: joins the pieces, checks them, unpacks _C to the engine's folder
# (GDN_ENGINE_ROOT, default /tmp/gdn-engine, as h200_engine_stage.sh).
set -e
target=\${GDN_ENGINE_ROOT:-/tmp/gdn-engine}
parts=\$target-so-parts
[ -f \$parts/cpart.00 ] || { echo "run .device-engine-so-1/stage.sh first" >&2; exit 1; }
cp "\$(dirname "\$0")"/cpart.* \$parts/
cat \$parts/cpart.* > \$parts/c.xz
echo "$sum  \$parts/c.xz" | sha256sum -c --quiet
mkdir -p \$target
[ -f \$target/_C_stable_libtorch.abi3.so ] \\
  || xz -T0 -dc \$parts/c.xz > \$target/_C_stable_libtorch.abi3.so
ls -la \$target
EOS
chmod +x .device-engine-so-1/stage.sh .device-engine-so-2/stage.sh
du -sh .device-engine-so-1 .device-engine-so-2

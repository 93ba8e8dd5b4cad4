#!/usr/bin/env bash
# Installs what the launcher tests need when it is missing: Debian's openssh-server and
# client (agents over ssh), and Slurm 22.05 with munge (slurmctld, slurmd, the clients).
# usage: scripts/setup-launchers.sh [ssh|slurm|all]   Exits non-zero if it cannot.
set -euo pipefail
what=${1:-all}
packages=()
case "$what" in
  ssh) packages=(openssh-server openssh-client) ;;
  slurm) packages=(slurmd slurmctld slurm-client munge) ;;
  all) packages=(openssh-server openssh-client slurmd slurmctld slurm-client munge) ;;
  *) echo "usage: $0 [ssh|slurm|all]" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
  || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; }

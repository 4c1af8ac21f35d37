#!/usr/bin/env bash
# The shipped system unit (systemd/astraeusd.service, every hardening line
# of it; only ExecStart changed by a drop-in, for the binary under test and
# --sim) and unit workers under a real systemd *system* manager: systemd
# booted as PID 1 of a private PID and mount namespace, with the host's /
# read-only in there, a writable copy of /etc, and every directory boot
# writes to on a tmpfs of its own (booting on the host's disk,
# systemd-tmpfiles --boot empties the host's /tmp: seen once).
# Run by tests/system_manager.rs, as root, as:
#   bash tests/system_manager.sh ASTRAEUSD ASTRAEUSCTL POLICY MEMBER SIM_FILE UNIT
# What it shows: the hardened unit starts (Type=notify, on the system bus,
# its ledger in StateDirectory), a group member's unit worker runs as that
# member (User=), root's as root, a stranger's is refused; `journalctl -u
# astraeus-worker-NAME` has the worker's output and the daemon's journal
# says how it ended; a stuck service loop stops the watchdog pings, systemd
# kills the daemon and the unit's Restart= starts a new one.
set -euo pipefail
daemon=$1 host_ctl=$2 policy=$3 member=$4 sim=$5 unit=$6
ctl=/run/astraeus-test/astraeusctl # $host_ctl, as seen inside
here=$(mktemp -d /var/lib/astraeus-sysmgr.XXXXXX)
pid=
cleanup() {
    # SIGKILL to PID 1 of the namespace ends every process in it.
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    sleep 0.5
    rm -rf "$here"
}
trap cleanup EXIT
cat > "$here/boot" <<BOOT
set -e
mount -o remount,bind,ro /
# What the test brings (the binaries, the policy, the sim file: perhaps
# under /tmp, a fresh tmpfs in here below) goes to /run/astraeus-test first
# (not /run/astraeus: the unit's RuntimeDirectory, emptied when it stops).
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/astraeus-test /run/systemd/system/astraeusd.service.d
touch /run/astraeus-test/astraeusd /run/astraeus-test/astraeusctl
mount --bind "$daemon" /run/astraeus-test/astraeusd
mount --bind "$host_ctl" /run/astraeus-test/astraeusctl
cp "$sim" /run/astraeus-test/majin.toml
cp "$unit" /run/systemd/system/astraeusd.service
# A writable copy of /etc: the bus policy, ConfigurationDirectory=astraeus.
cp -a /etc /run/etc
mount --bind /run/etc /etc
cp "$policy" /etc/dbus-1/system.d/org.astraeus.Node1.conf
mkdir -p /etc/astraeus
printf '[runtime]\nstop_timeout_seconds = 2\n' > /etc/astraeus/node.toml
for d in /tmp /var/tmp /var/log /var/cache /var/lib; do
    mount -t tmpfs -o mode=0755 tmpfs "\$d"
done
chmod 1777 /tmp /var/tmp
# Nothing that cleans or creates files at boot.
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service systemd-tmpfiles-clean.timer; do
    ln -s /dev/null /run/systemd/system/\$u
done
cat > /run/systemd/system/astraeusd.service.d/sim.conf <<UNIT
[Service]
ExecStart=
ExecStart=/run/astraeus-test/astraeusd --sim /run/astraeus-test/majin.toml
UNIT
cat > /run/systemd/system/astraeus-test.target <<UNIT
[Unit]
Description=just enough to run astraeusd
Requires=systemd-journald.socket dbus.socket astraeusd.service
UNIT
exec /lib/systemd/systemd --system --unit=astraeus-test.target
BOOT
unshare --pid --fork --mount --propagation private --mount-proc bash "$here/boot" \
    > "$here/boot.log" 2>&1 &
booter=$!
for _ in $(seq 100); do pid=$(pgrep -P "$booter" || true); [ -n "$pid" ] && break; sleep 0.1; done
[ -n "$pid" ] || { cat "$here/boot.log"; exit 1; }
inside() { nsenter -t "$pid" -m -p -- "$@"; }
as() { local who=$1; shift; inside setpriv --reuid="$who" --regid="$(id -g "$who")" --init-groups "$@"; }
fail() {
    echo "FAIL: $*"
    inside journalctl -o short --no-pager 2>&1 | tail -60 || true
    echo "-- the daemon's unit:"
    inside journalctl -u astraeusd.service -o short --no-pager 2>&1 | tail -20 || true
    tail -20 "$here/boot.log"
    exit 1
}
for _ in $(seq 300); do inside busctl status org.astraeus.Node1 >/dev/null 2>&1 && break; sleep 0.1; done
inside busctl status org.astraeus.Node1 >/dev/null 2>&1 || fail "the daemon never came up under the system manager"
[ "$(inside systemctl show astraeusd.service -p ActiveState --value)" = active ] || fail "not active"
[ "$(inside systemctl show astraeusd.service -p NRestarts --value)" = 0 ] || fail "restarted"
inside test -f /var/lib/astraeus/ledger.db || fail "no ledger in its StateDirectory"
# The shipped hardening is what runs: seen from the process itself.
main=$(inside systemctl show astraeusd.service -p MainPID --value)
caps=$(inside sed -n 's/^CapBnd:\t//p' "/proc/$main/status")
[ "$caps" = 0000000000000004 ] || fail "bounding set $caps, not CAP_DAC_READ_SEARCH alone"
[ "$(inside sed -n 's/^NoNewPrivs:\t//p' "/proc/$main/status")" = 1 ] || fail "NoNewPrivileges"

ended() {
    for _ in $(seq 300); do
        inside journalctl -u astraeusd.service -o cat --no-pager | grep -q "worker $1 exited with status $2" && return
        sleep 0.1
    done
    fail "worker $1 never recorded as exited with status $2"
}

# The worker's own line in `journalctl -u` (journald may file it a moment
# after the daemon has seen the unit end).
worker_said() {
    local said
    for _ in $(seq 300); do
        said=$(inside journalctl -u "astraeus-worker-$1.service" -o cat --no-pager | grep "^I am" || true)
        [ -n "$said" ] && break
        sleep 0.1
    done
    echo "$said"
}

echo "== systemctl reload re-reads /etc/astraeus/node.toml (ExecReload under the hardening)"
inside sh -c 'printf "machine = \"renamed\"\n[runtime]\nstop_timeout_seconds = 2\n" > /etc/astraeus/node.toml'
inside systemctl reload astraeusd.service || fail "systemctl reload"
for _ in $(seq 300); do
    inside journalctl -u astraeusd.service -o cat --no-pager | grep -qx "node.toml reloaded: applied machine" && break
    sleep 0.1
done
inside journalctl -u astraeusd.service -o cat --no-pager | grep -qx "node.toml reloaded: applied machine" \
    || fail "no reload line"

echo "== a member's unit worker runs as the member; journalctl -u has its output"
spec='{"name":"NAME","run":{"unit":{"exec":["/bin/sh","-c","echo I am $(id -un) in group $(id -gn)"]}}}'
as "$member" "$ctl" submit - <<< "${spec/NAME/mine}" || fail "the member's submit"
ended mine 0
said=$(worker_said mine)
[ "$said" = "I am $member in group astraeus" ] || fail "the member's unit said: $said"
# Placed once (not again as its unit went from starting to running).
placed=$(inside journalctl -o cat --no-pager MESSAGE_ID=289c420c04474b6894f80da2da49d6c0 WORKER=mine)
[ "$placed" = "worker mine placed: —" ] || fail "the placed events of mine: $placed"

echo "== root's unit worker runs as root"
inside "$ctl" submit - <<< "${spec/NAME/roots}" || fail "root's submit"
ended roots 0
said=$(worker_said roots)
[ "$said" = "I am root in group root" ] || fail "root's unit said: $said"

echo "== a stranger's unit worker is refused"
if out=$(as nobody "$ctl" submit - <<< "${spec/NAME/theirs}" 2>&1); then fail "nobody submitted: $out"; fi
grep -q "AccessDenied" <<< "$out" || fail "nobody got: $out"
inside journalctl -u astraeus-worker-theirs.service -o cat --no-pager | grep -q . && fail "a unit ran for nobody"

echo "== a stuck loop: the unit's watchdog kills the daemon and Restart= brings it back"
# WatchdogSec shortened from the shipped 30 s; the loop blocks at its 60th
# turn (~12 s at a 0.2 s refresh): the daemon must first outlive twice the
# watchdog period, pinging, or a daemon that never pings would pass too.
inside sh -c 'printf "[inventory]\nrefresh_seconds = 0.2\n" > /etc/astraeus/node.toml'
inside sh -c 'printf "[Service]\nWatchdogSec=2s\nEnvironment=ASTRAEUS_FAILPOINTS=service.loop=block@60\n" \
    > /run/systemd/system/astraeusd.service.d/watchdog.conf'
inside systemctl daemon-reload
inside systemctl restart astraeusd.service || fail "restart with the watchdog drop-in"
started=$(date +%s%N)
stuck=$(inside systemctl show astraeusd.service -p MainPID --value)
for _ in $(seq 600); do
    inside journalctl -u astraeusd.service -o cat --no-pager _PID="$stuck" | grep -q "failpoint service.loop reached" && break
    sleep 0.05
done
blocked_ms=$(( ($(date +%s%N) - started) / 1000000 ))
[ "$blocked_ms" -gt 4000 ] || fail "the loop blocked after $blocked_ms ms, too soon to tell pings from none"
[ "$(inside systemctl show astraeusd.service -p NRestarts --value)" = 0 ] \
    || fail "killed before its loop was stuck: the pings did not keep it alive"
[ "$(inside systemctl show astraeusd.service -p MainPID --value)" = "$stuck" ] || fail "a new daemon already"
restarted() {
    [ "$(inside systemctl show astraeusd.service -p NRestarts --value)" -ge 1 ] &&
        inside journalctl -u astraeusd.service -o cat --no-pager | grep -q "Watchdog timeout"
}
for _ in $(seq 300); do restarted && break; sleep 0.1; done
restarted || fail "no watchdog timeout and restart"
inside journalctl -u astraeusd.service -o cat --no-pager _PID="$stuck" | grep -q "failpoint service.loop reached" \
    || fail "the killed daemon was not the one whose loop was stuck"
for _ in $(seq 300); do
    now=$(inside systemctl show astraeusd.service -p MainPID --value)
    [ "$now" != 0 ] && [ "$now" != "$stuck" ] && inside busctl status org.astraeus.Node1 >/dev/null 2>&1 && break
    sleep 0.1
done
[ "$now" != 0 ] && [ "$now" != "$stuck" ] || fail "no new daemon after the watchdog's kill"

echo "system manager: OK"

# $1 = 1 on install, 2 on upgrade.
getent group astraeus >/dev/null || groupadd --system astraeus
install -d -m 0750 /var/lib/astraeus
if [ -S /run/dbus/system_bus_socket ] && command -v dbus-send >/dev/null; then
    dbus-send --system --type=method_call --dest=org.freedesktop.DBus / org.freedesktop.DBus.ReloadConfig >/dev/null 2>&1 || true
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    if [ "$1" = 1 ]; then
        systemctl enable --now astraeusd.service >/dev/null 2>&1 || echo "astraeusd: enabled; it did not start (see journalctl -u astraeusd)" >&2
    else
        systemctl try-restart astraeusd.service >/dev/null 2>&1 || true
    fi
fi

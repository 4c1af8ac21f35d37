# %post with %systemd_post semantics: $1 = 1 on a first install, 2 on an
# upgrade. Never enables by itself: `systemctl preset` applies the
# distribution's and the admin's presets (Fedora policy), on first install only.
if [ "$1" -eq 1 ] && [ -x /usr/bin/systemctl ]; then
    systemctl --no-reload preset astraeusd.service >/dev/null 2>&1 || :
fi
if [ -S /run/dbus/system_bus_socket ] && command -v dbus-send >/dev/null; then
    dbus-send --system --type=method_call --dest=org.freedesktop.DBus / org.freedesktop.DBus.ReloadConfig >/dev/null 2>&1 || :
fi
# The per-GPU lock directory every user's daemon shares (%tmpfiles_create).
if [ -x /usr/bin/systemd-tmpfiles ]; then
    /usr/bin/systemd-tmpfiles --create astraeusd.conf >/dev/null 2>&1 || :
fi

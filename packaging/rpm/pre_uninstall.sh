# %preun with %systemd_preun semantics: $1 = 0 on removal (stop and
# disable it), 1 on an upgrade (leave it; %postun restarts it).
if [ "$1" -eq 0 ] && [ -x /usr/bin/systemctl ]; then
    systemctl --no-reload disable --now astraeusd.service >/dev/null 2>&1 || :
fi

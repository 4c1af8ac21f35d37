# %postun with %systemd_postun_with_restart semantics: $1 = 0 on removal,
# 1 on an upgrade (restart it if it runs, to run the new binary).
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 1 ]; then
        systemctl try-restart astraeusd.service >/dev/null 2>&1 || :
    fi
fi

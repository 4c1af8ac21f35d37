# $1 = 0 on removal, 1 on upgrade.
if [ "$1" = 0 ] && [ -d /run/systemd/system ]; then
    systemctl disable --now astraeusd.service >/dev/null 2>&1 || true
fi

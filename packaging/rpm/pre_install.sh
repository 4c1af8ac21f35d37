# %pre (as %sysusers_create_compat): the group from the sysusers.d file, before files land.
if command -v systemd-sysusers >/dev/null; then
    echo 'g astraeus - -' | systemd-sysusers --replace=/usr/lib/sysusers.d/astraeus.conf - || :
else
    getent group astraeus >/dev/null || groupadd --system astraeus || :
fi

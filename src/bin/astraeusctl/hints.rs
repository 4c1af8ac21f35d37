//! What a failure means to the person who met it: the bus that was tried,
//! what to check, and a refusal's uid and group said by name.

/// The bus a connection was asked of, as a person would look for it.
pub fn bus_tried(address: Option<&str>, session: bool) -> String {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (address, session) {
        (Some(a), _) => format!("the bus at {a}"),
        (None, true) => match var("DBUS_SESSION_BUS_ADDRESS") {
            Some(a) => format!("the session bus at {a} ($DBUS_SESSION_BUS_ADDRESS)"),
            None => "the session bus (no $DBUS_SESSION_BUS_ADDRESS; $XDG_RUNTIME_DIR/bus)".into(),
        },
        (None, false) => match var("DBUS_SYSTEM_BUS_ADDRESS") {
            Some(a) => format!("the system bus at {a} ($DBUS_SYSTEM_BUS_ADDRESS)"),
            None => "the system bus at /run/dbus/system_bus_socket".into(),
        },
    }
}

/// The line under an error that says what to check, where there is one.
pub fn what_to_check(kind: &str, code: u8, address: Option<&str>, session: bool) -> Option<String> {
    if kind == "NoBus" {
        // No bus at all: asking after astraeusd would mislead.
        return Some(
            match (address, session) {
                (Some(_), _) => "is a bus listening at that address?",
                (None, true) => "a login session has one (systemctl --user status dbus.socket)",
                (None, false) => "is D-Bus running? systemctl status dbus",
            }
            .to_string(),
        );
    }
    // A daemon that went away has said so already, with where to look.
    if code != 69 || kind == "Gone" || kind == "NoDaemon" {
        return None;
    }
    Some(match (address, session) {
        (Some(a), _) => format!("is astraeusd running on the bus at {a}?"),
        (None, true) => "is astraeusd running (--session: the user's daemon)? \
                         systemctl --user status astraeusd"
            .to_string(),
        (None, false) => "is astraeusd running (the system bus's daemon)? \
                          systemctl status astraeusd"
            .to_string(),
    })
}

/// An error as printed: a refusal names the caller (this process's user:
/// the daemon saw the same uid) and says when the group it names does not
/// exist here, both looked up on this host.
pub fn explained(kind: &str, message: &str) -> String {
    if kind != "AccessDenied" {
        return message.to_string();
    }
    let uid = unsafe { libc::geteuid() };
    let name = astraeusd::auth::user_name(uid);
    let group = message
        .split("group ")
        .nth(1)
        .and_then(|rest| {
            rest.split(|c: char| c.is_whitespace() || c == ')' || c == ',')
                .next()
        })
        .filter(|g| !g.is_empty());
    let missing = group.filter(|g| astraeusd::auth::group_id(g).is_none());
    denial_in_words(message, uid, name.as_deref(), missing)
}

/// [`explained`]'s text, its lookups done: `uid N` as `uid N (NAME)`, and
/// a note when `missing_group` does not exist.
pub fn denial_in_words(
    message: &str,
    uid: u32,
    name: Option<&str>,
    missing_group: Option<&str>,
) -> String {
    let mut out = message.to_string();
    let needle = format!("uid {uid}");
    if let (Some(name), Some(at)) = (name, out.find(&needle)) {
        let end = at + needle.len();
        if !out[end..].starts_with(|c: char| c.is_ascii_digit()) {
            out.insert_str(end, &format!(" ({name})"));
        }
    }
    if let Some(g) = missing_group {
        out.push_str(&format!(
            " (there is no group {g} on this host: the package's sysusers.d file makes it, \
             systemd-sysusers; or set [access] group)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_user_and_says_when_its_group_is_missing() {
        let m = "uid 65534 may not submit workers: only root and members of group astraeus may";
        assert_eq!(
            denial_in_words(m, 65534, Some("nobody"), None),
            "uid 65534 (nobody) may not submit workers: only root and members of group astraeus may"
        );
        assert!(denial_in_words(m, 65534, None, Some("astraeus"))
            .ends_with("(there is no group astraeus on this host: the package's sysusers.d file makes it, systemd-sysusers; or set [access] group)"));
        // Another uid that merely starts alike is left alone.
        assert_eq!(
            denial_in_words("uid 655340 may not", 65534, Some("nobody"), None),
            "uid 655340 may not"
        );
    }
}

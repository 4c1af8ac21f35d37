//! What each pair of Manager methods (`X` and `XMs`, seconds and
//! milliseconds) asks of the loop, once: the pair differ only in the units
//! they translate (manager.rs has the interface).

use super::{bounded, BusError, Loop};
use crate::command::{Command, Window};
use crate::wire::{EndedRow, SliceReportRow, SliceRow, UsageRow};
use zbus::message::Header;
use zbus::Connection;

pub(super) async fn ended(
    lp: &Loop,
    hdr: &Header<'_>,
    conn: &Connection,
    since_ms: i64,
    limit: u32,
) -> Result<Vec<EndedRow>, BusError> {
    if !(1..=10_000).contains(&limit) {
        return Err(BusError::from(crate::error::Error::InvalidRequest(
            format!("limit: 1 to 10000 workers; got {limit}"),
        )));
    }
    let rows = lp
        .ask_in_turn(hdr, conn, |reply| Command::ListEnded {
            since_ms,
            limit,
            reply,
        })
        .await??;
    let instead = "ask for fewer (limit) or a later since";
    super::tree::fits_the_bus(&rows, "the list of ended workers", instead)?;
    Ok(rows)
}

pub(super) async fn preview(
    lp: &Loop,
    hdr: &Header<'_>,
    conn: &Connection,
    template: String,
    actions: String,
) -> Result<(Vec<SliceRow>, Vec<String>), BusError> {
    bounded(&[("template", &template), ("actions", &actions)])?;
    Ok(lp
        .ask_as(hdr, conn, |caller, reply| Command::PreviewSchedule {
            template,
            actions,
            caller,
            reply,
        })
        .await??)
}

pub(super) async fn slices(
    lp: &Loop,
    hdr: &Header<'_>,
    conn: &Connection,
    window: Window,
) -> Result<Vec<SliceRow>, BusError> {
    Ok(lp
        .ask_from(hdr, conn, |reply| Command::ListSlices { window, reply })
        .await??)
}

pub(super) async fn next_slices(
    lp: &Loop,
    hdr: &Header<'_>,
    conn: &Connection,
    count: u32,
) -> Result<Vec<SliceRow>, BusError> {
    if !(1..=1000).contains(&count) {
        return Err(BusError::from(crate::error::Error::InvalidRequest(
            format!("count: 1 to 1000 slices; got {count}"),
        )));
    }
    Ok(lp
        .ask_from(hdr, conn, |reply| Command::ListNextSlices { count, reply })
        .await??)
}

pub(super) async fn notes(
    lp: &Loop,
    hdr: &Header<'_>,
    conn: &Connection,
    window: Window,
) -> Result<Vec<String>, BusError> {
    Ok(lp
        .ask_from(hdr, conn, |reply| Command::ListSliceNotes { window, reply })
        .await??)
}

/// `window` in units of `ms_each` milliseconds (1 or 1000).
pub(super) async fn usage(
    lp: &Loop,
    hdr: &Header<'_>,
    conn: &Connection,
    (from, to): (i64, i64),
    ms_each: i64,
    group_by: String,
) -> Result<Vec<crate::report::Row>, BusError> {
    // Checked before the caller's turn: a malformed report waits for nothing.
    bounded(&[("group_by", &group_by)])?;
    let group_by = group_by
        .parse::<crate::report::GroupBy>()
        .map_err(crate::error::Error::from)?;
    let window = if ms_each == 1 {
        Window::checked_ms(from, to)?
    } else {
        Window::checked(from, to)?
    };
    let rows = lp
        .ask_in_turn(hdr, conn, |reply| Command::UsageReport {
            window,
            group_by,
            reply,
        })
        .await??;
    let instead = "ask for a shorter window, or group by owner or gpu";
    let texts = rows
        .iter()
        .map(|r| [r.key.as_str(), r.kind.as_str(), r.gpu_uuid.as_str()]);
    super::tree::too_big(UsageRow::wire_size(texts), "the report", instead)?;
    Ok(rows)
}

pub(super) async fn slice_rows(
    lp: &Loop,
    hdr: &Header<'_>,
    conn: &Connection,
    template: String,
    window: Window,
) -> Result<Vec<SliceReportRow>, BusError> {
    let rows = lp
        .ask_in_turn(hdr, conn, |reply| Command::SliceReport {
            template,
            window,
            reply,
        })
        .await??;
    let instead = "ask for a shorter window or one template";
    super::tree::fits_the_bus(&rows, "the report", instead)?;
    Ok(rows)
}

/// The `*Ms` methods' rows as the first methods send them.
pub(super) fn in_seconds<T, U: From<T>>(rows: Vec<T>) -> Vec<U> {
    rows.into_iter().map(U::from).collect()
}

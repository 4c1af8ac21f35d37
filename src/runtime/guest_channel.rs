//! The guest's GPU channel (seed 003: a slice's GPU figures come from
//! inside the VM): the lines the guest writes to [`GPU_CHANNEL`], read
//! from the unix socket QEMU listens on, gated ([`GuestGate`]: a guest
//! flooding it holds no one) and parsed into samples.

use crate::runtime::vm_host::VmHost;
use crate::slicing::handoff;
use crate::slicing::meter::{GpuSample, GuestGate, GPU_CHANNEL, MAX_LINE_BYTES};
use crate::time::EpochMs;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Reads the GPU figures the guest writes to its [`GPU_CHANNEL`] and sends
/// each on `tx` with its time, until aborted (the slice ended) or `tx`
/// closes. The host end is the
/// unix socket QEMU listens on (libvirt puts its path in the live XML); a
/// VM without the channel reports no GPU figures. Reconnects after the
/// guest side closes (a reboot inside the slice).
pub async fn read_guest_gpus(
    vms: Arc<dyn VmHost>,
    domain: String,
    template: String,
    tx: mpsc::Sender<(GpuSample, EpochMs)>,
) {
    // The slice begins when its start is issued; the socket's path is in
    // the live XML only once the domain runs.
    let mut warned = false;
    loop {
        match vms.is_on(&domain).await {
            Ok(true) => break,
            Ok(false) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
            // libvirt away for a moment: look again, said once.
            Err(e) => {
                if !warned {
                    tracing::warn!(template = %template, "waiting for {domain} to run: {e}");
                    warned = true;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await
            }
        }
    }
    let path = match vms.channel_path(&domain, GPU_CHANNEL).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            tracing::info!(template = %template, "{domain} has no {GPU_CHANNEL} channel: its GPU figures are not reported");
            return;
        }
        Err(e) => {
            tracing::warn!(template = %template, "reading {domain}'s channels: {e}");
            return;
        }
    };
    let mut warned = false;
    loop {
        match tokio::net::UnixStream::connect(&path).await {
            Ok(stream) => {
                tracing::info!(template = %template, "reading the GPU figures {domain}'s guest writes to {path}");
                warned = false;
                let mut reader = tokio::io::BufReader::new(stream);
                let mut gate = GuestGate::default();
                let (mut line, mut skipping) = (Vec::new(), false);
                // The gate counts on a clock that never steps back (the
                // wall clock does: readings would stop for as long).
                let opened = std::time::Instant::now();
                while let Ok(Some(whole)) =
                    read_line_within(&mut reader, &mut line, &mut skipping).await
                {
                    let at = EpochMs::now();
                    let since = opened.elapsed().as_millis() as u64;
                    if let Some(pause) = gate.line(since) {
                        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                        continue;
                    }
                    let Some(sample) = whole
                        .then(|| std::str::from_utf8(&line).ok().and_then(GpuSample::parse))
                        .flatten()
                    else {
                        continue;
                    };
                    if !gate.admit(sample.index, since) {
                        continue;
                    }
                    // Numbers only (the line is the guest's): what the
                    // slice's figures are computed from, at debug level.
                    tracing::debug!(
                        template = %template,
                        "guest GPU reading of {template} at {} ms: GPU {}, {:?} %, {:?} MiB, {:?} W",
                        at.0,
                        sample.index,
                        sample.util_pct,
                        sample.memory_mib,
                        sample.power_w
                    );
                    if tx.send((sample, at)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) if !warned => {
                warned = true;
                tracing::info!(template = %template, "the GPU channel of {domain} at {path} is not open yet: {e}");
            }
            Err(_) => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(handoff::DEFAULT_POLL_MS)).await;
    }
}

/// Reads the guest's next line into `line` (without its newline):
/// Some(true) for a line of at most [`MAX_LINE_BYTES`], None at the end.
/// A longer line is not kept: Some(false) for each buffer of it read past
/// (`skipping` says a call ended inside one), so the caller's gate counts
/// a guest that never writes a newline as it counts lines.
pub(crate) async fn read_line_within<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    skipping: &mut bool,
) -> std::io::Result<Option<bool>> {
    use tokio::io::AsyncBufReadExt;
    line.clear();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            *skipping = false;
            return Ok((!line.is_empty()).then_some(true));
        }
        let (taken, ended) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (available.len(), false),
        };
        let too_long = *skipping || line.len() + taken > MAX_LINE_BYTES;
        if !too_long {
            line.extend_from_slice(&available[..taken]);
        }
        reader.consume(taken + usize::from(ended));
        if too_long {
            line.clear();
            *skipping = !ended;
            return Ok(Some(false));
        }
        if ended {
            return Ok(Some(true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest's lines are kept up to [`MAX_LINE_BYTES`] each: a longer one
    /// (a guest that never writes a newline) is read past, not into memory.
    #[tokio::test]
    async fn a_guests_long_line_is_read_past_not_kept() {
        let long = vec![b'a'; 100_000];
        let mut input = b"0, 1, 2, 3\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\n1, 4, 5, 6\nlast");
        let mut reader = tokio::io::BufReader::with_capacity(64, &input[..]);
        let (mut line, mut skipping) = (Vec::new(), false);
        let (mut lines, mut skipped) = (Vec::new(), 0);
        while let Some(whole) = read_line_within(&mut reader, &mut line, &mut skipping)
            .await
            .unwrap()
        {
            assert!(line.len() <= MAX_LINE_BYTES);
            match whole {
                true => lines.push(String::from_utf8(line.clone()).unwrap()),
                false => skipped += 1,
            }
        }
        assert_eq!(lines, ["0, 1, 2, 3", "1, 4, 5, 6", "last"]);
        // Told once per buffer read past (64 bytes here), for the gate.
        assert!(skipped >= (100_000 - MAX_LINE_BYTES) / 64, "{skipped}");
    }
}

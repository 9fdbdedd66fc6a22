//! Progress bars on an interactive terminal (indicatif): one per table
//! under backfill, drawn on stderr when stderr is a terminal and the log
//! is text, with the log's lines written above them. A log file, a pipe
//! or a JSON log gets the log lines only: the same progress is in them
//! every few seconds.

use std::io::{self, IsTerminal, Write};
use std::sync::OnceLock;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

static BARS: OnceLock<Option<MultiProgress>> = OnceLock::new();

/// Draws bars from now on if stderr is a terminal and the log is text;
/// the first call decides.
pub(crate) fn init(text_log: bool) {
    BARS.get_or_init(|| {
        (text_log && io::stderr().is_terminal())
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
    });
}

fn bars() -> Option<&'static MultiProgress> {
    BARS.get().and_then(Option::as_ref)
}

/// Stderr for log lines, which clears the bars for each line and draws
/// them again under it.
pub(crate) struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match bars() {
            Some(bars) => bars.suspend(|| io::stderr().write(buf)),
            None => io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// A table's backfill bar: rows read of the estimate, rate and time
/// left; `None` where no bars are drawn.
pub(crate) fn backfill_bar(table: &str, rows: u64, estimate: Option<u64>) -> Option<ProgressBar> {
    let bars = bars()?;
    let bar = bars.add(ProgressBar::new(estimate.unwrap_or(0).max(rows)));
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} backfill [{bar:30}] {human_pos}/{human_len} rows, {per_sec}, {eta} left",
        )
        .expect("the template parses")
        .progress_chars("=> "),
    );
    bar.set_prefix(table.to_owned());
    bar.set_position(rows);
    bar.enable_steady_tick(Duration::from_millis(500));
    Some(bar)
}

//! Drawing the three plots (rf per mini-epoch, rf histogram, tier bandwidth) with plotters
//! into an RGB buffer and encoding them as PNG with the `png` crate. Text uses the embedded
//! DejaVu Sans, registered once, so plots render without system fonts.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use super::analysis::Analysis;
use super::series::{mount_curve, smoothed_rate};
use super::text::rate;
use super::{ReportError, ReportSummary, PLOT_SIZE};

pub(super) type DrawResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The drawing area of one plot: an RGB buffer of [`PLOT_SIZE`].
pub(super) type Root<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

pub(super) const FONT: &str = "sans-serif";

pub(super) fn register_font() -> Result<(), ReportError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(ReportError::Font)
    }
}

/// A unit for byte rates: divisor and label, chosen so the largest value reads well.
pub(super) fn rate_unit(max: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 5] = [
        (1.0, "B/s"),
        (1024.0, "KiB/s"),
        (1048576.0, "MiB/s"),
        (1073741824.0, "GiB/s"),
        (1099511627776.0, "TiB/s"),
    ];
    let mut pick = UNITS[0];
    for u in UNITS {
        if max >= u.0 {
            pick = u;
        }
    }
    pick
}

/// An axis label with as many decimals as the axis range calls for.
pub(super) fn decimals(v: f64, range: f64) -> String {
    if range >= 20.0 {
        format!("{v:.0}")
    } else if range >= 2.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A unit for elapsed time: divisor and label.
pub(super) fn time_unit(span: f64) -> (f64, &'static str) {
    if span > 3.0 * 3600.0 {
        (3600.0, "hours")
    } else if span > 3.0 * 60.0 {
        (60.0, "minutes")
    } else {
        (1.0, "seconds")
    }
}

pub(super) fn no_data(area: &Root<'_>, what: &str) -> DrawResult {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        what.to_string(),
        (w as i32 / 2 - 200, h as i32 / 2),
        (FONT, 22).into_font().color(&RGBColor(120, 120, 120)),
    ))?;
    Ok(())
}

pub(super) const RF_COLOR: RGBColor = RGBColor(31, 119, 180);
pub(super) const WANTED_COLOR: RGBColor = RGBColor(255, 127, 14);
pub(super) const STALL_COLOR: RGBColor = RGBColor(214, 39, 40);
pub(super) const MEAN_COLOR: RGBColor = RGBColor(44, 160, 44);

pub(super) fn legend_line(c: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
}

/// The legend box every plot draws: the series' labels on a translucent white box.
pub(super) fn draw_legend<'a>(
    chart: &mut ChartContext<
        'a,
        BitMapBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    position: SeriesLabelPosition,
) -> DrawResult {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 18))
        .draw()?;
    Ok(())
}

pub(super) fn draw_rf(root: &Root<'_>, s: &ReportSummary) -> DrawResult {
    root.fill(&WHITE)?;
    let rows = &s.mini_epochs;
    let title = format!(
        "rf per mini-epoch ({} completed, policy {})",
        rows.len(),
        s.rf_policy.as_deref().unwrap_or("n/a")
    );
    let x0 = rows.first().map_or(0.0, |r| r.sequence as f64);
    let x1 = rows.last().map_or(1.0, |r| r.sequence as f64);
    let (x0, x1) = if x1 - x0 < 1.0 {
        (x0 - 1.0, x1 + 1.0)
    } else {
        (x0 - 0.5, x1 + 0.5)
    };
    let ymax = rows
        .iter()
        .map(|r| r.rf.max(r.wanted_rf.unwrap_or(0)))
        .chain(s.stall_free_rf)
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.35;
    let mut chart = ChartBuilder::on(root)
        .caption(&title, (FONT, 30))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("mini-epoch (sequence in the run)")
        .y_desc("rf (passes over the mini-epoch)")
        .axis_desc_style((FONT, 22))
        .label_style((FONT, 18))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    if rows.is_empty() {
        return no_data(root, "no completed mini-epoch in the log yet");
    }
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.sequence as f64, f64::from(r.rf)))
        .collect();
    chart
        .draw_series(LineSeries::new(
            pts.iter().copied(),
            RF_COLOR.stroke_width(2),
        ))?
        .label("effective rf (passes the mini-epoch got, bonus passes included)")
        .legend(legend_line(RF_COLOR));
    let marker = if rows.len() <= 300 { 4 } else { 2 };
    chart.draw_series(
        pts.iter()
            .map(|&p| Circle::new(p, marker, RF_COLOR.filled())),
    )?;
    let wanted: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| {
            let w = r.wanted_rf.filter(|w| *w != r.rf)?;
            Some((r.sequence as f64, f64::from(w)))
        })
        .collect();
    if !wanted.is_empty() {
        chart
            .draw_series(
                wanted
                    .iter()
                    .map(|&p| Cross::new(p, marker + 2, WANTED_COLOR.stroke_width(2))),
            )?
            .label("rf the policy wanted, where it got more (bonus passes)")
            .legend(|(x, y)| Cross::new((x + 12, y), 6, WANTED_COLOR.stroke_width(2)));
    }
    if let Some(st) = &s.rf {
        chart
            .draw_series(DashedLineSeries::new(
                [(x0, st.mean), (x1, st.mean)],
                10,
                6,
                MEAN_COLOR.stroke_width(2),
            ))?
            .label(format!("mean effective rf {:.1}", st.mean))
            .legend(legend_line(MEAN_COLOR));
    }
    if let Some(sf) = s.stall_free_rf {
        let y = f64::from(sf);
        chart
            .draw_series(DashedLineSeries::new(
                [(x0, y), (x1, y)],
                4,
                4,
                STALL_COLOR.stroke_width(2),
            ))?
            .label(format!("stall-free rf {sf} = ceil(EB1/B2)"))
            .legend(legend_line(STALL_COLOR));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

pub(super) fn draw_histogram(root: &Root<'_>, s: &ReportSummary) -> DrawResult {
    root.fill(&WHITE)?;
    let rfs: Vec<u32> = s.mini_epochs.iter().map(|r| r.rf).collect();
    // The axis starts at rf 1, so the stall-free rf and small rf show in context; bins are
    // whole numbers of passes, at most about 40 of them.
    let min = 1u32;
    let max = rfs
        .iter()
        .copied()
        .chain(s.stall_free_rf)
        .max()
        .unwrap_or(1)
        .max(1);
    let width = max.div_ceil(40).max(1);
    let nbins = (max - min) / width + 1;
    let mut counts = vec![0u32; nbins as usize];
    for &rf in &rfs {
        counts[((rf.max(min) - min) / width) as usize] += 1;
    }
    let lo = f64::from(min) - 0.5;
    let hi = f64::from(min + nbins * width) - 0.5;
    let ymax = f64::from(counts.iter().copied().max().unwrap_or(1).max(1)) * 1.3;
    let title = format!(
        "Distribution of rf over {} mini-epochs{}",
        rfs.len(),
        s.rf.as_ref().map_or(String::new(), |r| format!(
            " (mean {:.1}, median {})",
            r.mean, r.p50
        ))
    );
    let mut chart = ChartBuilder::on(root)
        .caption(&title, (FONT, 30))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(80)
        .build_cartesian_2d(lo..hi, 0.0..ymax)?;
    let xdesc = if width == 1 {
        "rf (passes over the mini-epoch)".to_string()
    } else {
        format!("rf (passes over the mini-epoch), bins of {width}")
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(xdesc)
        .y_desc("mini-epochs")
        .axis_desc_style((FONT, 22))
        .label_style((FONT, 18))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    if rfs.is_empty() {
        return no_data(root, "no completed mini-epoch in the log yet");
    }
    chart
        .draw_series(
            counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, &c)| {
                    let b0 = f64::from(min + i as u32 * width) - 0.5;
                    let b1 = b0 + f64::from(width);
                    let pad = 0.08 * f64::from(width);
                    Rectangle::new(
                        [(b0 + pad, 0.0), (b1 - pad, f64::from(c))],
                        RF_COLOR.filled(),
                    )
                }),
        )?
        .label("mini-epochs with this rf")
        .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 20, y + 6)], RF_COLOR.filled()));
    if let Some(sf) = s.stall_free_rf {
        let x = f64::from(sf);
        if x >= lo && x <= hi {
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, 0.0), (x, ymax)],
                    4,
                    4,
                    STALL_COLOR.stroke_width(2),
                ))?
                .label(format!("stall-free rf {sf}"))
                .legend(legend_line(STALL_COLOR));
        }
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

pub(super) fn draw_bandwidth(root: &Root<'_>, a: &Analysis, s: &ReportSummary) -> DrawResult {
    root.fill(&WHITE)?;
    let tier = smoothed_rate(&a.tier, 400);
    let needed = smoothed_rate(&mount_curve(&a.passes), 400);
    let span = (a.t_end - a.t0).max(1.0);
    let (tdiv, tlabel) = time_unit(span);
    let vmax = tier
        .iter()
        .chain(needed.iter())
        .map(|p| p.1)
        .chain(s.eb1_bytes_per_s)
        .chain(s.eb2_bytes_per_s)
        .fold(0.0, f64::max)
        .max(1.0);
    let (bdiv, blabel) = rate_unit(vmax);
    let x = |t: f64| (t - a.t0) / tdiv;
    let y = |v: f64| v / bdiv;
    let title = "Capacity-tier bandwidth with MET vs reading every pass from the tier";
    // Headroom above the data for the legend.
    let ytop = y(vmax) * 1.45;
    let xtop = span / tdiv;
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 28))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..xtop, 0.0..ytop)?;
    let xfmt = |v: &f64| decimals(*v, xtop);
    let yfmt = |v: &f64| decimals(*v, ytop);
    chart
        .configure_mesh()
        .x_desc(format!("time since the first event ({tlabel})"))
        .y_desc(format!("bandwidth ({blabel})"))
        .axis_desc_style((FONT, 22))
        .label_style((FONT, 18))
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .draw()?;
    if tier.is_empty() && needed.is_empty() {
        return no_data(root, "no tier traffic or timed pass in the log yet");
    }
    if !needed.is_empty() {
        chart
            .draw_series(LineSeries::new(
                needed.iter().map(|p| (x(p.0), y(p.1))),
                WANTED_COLOR.stroke_width(2),
            ))?
            .label("needed without MET: bytes read through the mount per second (smoothed)")
            .legend(legend_line(WANTED_COLOR));
    }
    if !tier.is_empty() {
        chart.draw_series(AreaSeries::new(
            tier.iter().map(|p| (x(p.0), y(p.1))),
            0.0,
            RF_COLOR.mix(0.25),
        ))?;
        chart
            .draw_series(LineSeries::new(
                tier.iter().map(|p| (x(p.0), y(p.1))),
                RF_COLOR.stroke_width(2),
            ))?
            .label(format!(
                "capacity tier with MET ({}, smoothed)",
                a.tier_source
            ))
            .legend(legend_line(RF_COLOR));
    }
    let x1 = span / tdiv;
    if let Some(eb2) = s.eb2_bytes_per_s {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, y(eb2)), (x1, y(eb2))],
                10,
                6,
                MEAN_COLOR.stroke_width(2),
            ))?
            .label(format!("EB2, MET average: {}", rate(Some(eb2))))
            .legend(legend_line(MEAN_COLOR));
    }
    if let Some(eb1) = s.eb1_bytes_per_s {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, y(eb1)), (x1, y(eb1))],
                4,
                4,
                STALL_COLOR.stroke_width(2),
            ))?
            .label(format!("EB1, consumption average: {}", rate(Some(eb1))))
            .legend(legend_line(STALL_COLOR));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

pub(super) fn plot_err(path: &Path, e: impl std::fmt::Display) -> ReportError {
    ReportError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Draws one plot into an RGB buffer and writes it as a PNG.
///
/// The encoding is done here with the `png` crate rather than by plotters' `bitmap_encoder`
/// (the `image` crate): it drops a large dependency, and unfiltered rows with default
/// compression suit plots (large flat areas), keeping files small and encoding fast even in
/// debug builds.
pub(super) fn render_png(
    path: &Path,
    draw: impl FnOnce(&Root<'_>) -> DrawResult,
) -> Result<(), ReportError> {
    let (w, h) = PLOT_SIZE;
    let mut buf = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, PLOT_SIZE).into_drawing_area();
        draw(&root).map_err(|e| plot_err(path, e))?;
        root.present().map_err(|e| plot_err(path, e))?;
    }
    let io = |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Default);
    enc.set_filter(png::FilterType::NoFilter);
    enc.set_adaptive_filter(png::AdaptiveFilterType::NonAdaptive);
    let mut writer = enc.write_header().map_err(|e| plot_err(path, e))?;
    writer
        .write_image_data(&buf)
        .map_err(|e| plot_err(path, e))?;
    writer.finish().map_err(|e| plot_err(path, e))?;
    Ok(())
}

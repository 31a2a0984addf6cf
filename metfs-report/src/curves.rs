//! `metfs plot CURVES.json OUT.png`: line curves from a benchmark, drawn with the same plotters
//! set-up, embedded font and PNG encoder as the report's plots, so a benchmark's picture looks
//! like the rest of the project's and renders on nodes without system fonts.
//!
//! The input is one [`Curves`] document. It crosses a process boundary (benchmarks written in
//! Python produce it), so it is a typed struct read with unknown fields refused: a misspelt
//! key is an error naming it rather than a curve silently missing. A point that is not finite,
//! a series without points, or a document without series is refused with the series and point
//! named; nothing is written then.

use std::path::Path;

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use super::plot::{
    decimals, draw_legend, legend_line, register_font, render_png, DrawResult, Root, FONT,
};
use super::ReportError;

/// A plot of one or more named curves over shared axes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Curves {
    /// The caption above the plot.
    pub title: String,
    /// The x axis's description, with its unit.
    pub x_label: String,
    /// The y axis's description, with its unit.
    pub y_label: String,
    /// The curves, drawn in this order (legend order too).
    pub series: Vec<Series>,
    /// Horizontal reference lines (a target value, a bound), dashed.
    #[serde(default)]
    pub hlines: Vec<HLine>,
}

/// One named curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Series {
    /// Its legend entry.
    pub name: String,
    /// `[x, y]` pairs, drawn in the order given.
    pub points: Vec<[f64; 2]>,
}

/// A horizontal reference line across the whole x range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HLine {
    /// Where it crosses the y axis.
    pub y: f64,
    /// Its legend entry.
    pub label: String,
}

/// Colours of the curves, in order, repeating past the last (Tableau's ten).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

impl Curves {
    /// Reads and checks a curves document.
    pub fn load(path: &Path) -> Result<Curves, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |message: String| ReportError::BadCurves {
            path: path.to_path_buf(),
            message,
        };
        let curves: Curves = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        curves.check().map_err(bad)?;
        Ok(curves)
    }

    /// Why the document cannot be drawn, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.series.is_empty() {
            return Err("no series to draw".into());
        }
        for s in &self.series {
            if s.points.is_empty() {
                return Err(format!("series {:?} has no points", s.name));
            }
            if let Some(i) = s
                .points
                .iter()
                .position(|p| !p[0].is_finite() || !p[1].is_finite())
            {
                return Err(format!(
                    "series {:?}, point {i}: {:?} is not a pair of finite numbers",
                    s.name, s.points[i]
                ));
            }
        }
        if let Some(h) = self.hlines.iter().find(|h| !h.y.is_finite()) {
            return Err(format!("hline {:?}: y is not a finite number", h.label));
        }
        Ok(())
    }

    /// The axis ranges: the data's extent, with a margin so no curve runs along the frame.
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let pts = self.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for p in pts {
            x0 = x0.min(p[0]);
            x1 = x1.max(p[0]);
            y0 = y0.min(p[1]);
            y1 = y1.max(p[1]);
        }
        for h in &self.hlines {
            y0 = y0.min(h.y);
            y1 = y1.max(h.y);
        }
        let pad = |lo: f64, hi: f64, frac: f64| {
            let span = if hi > lo { hi - lo } else { lo.abs().max(1.0) };
            (lo - span * frac, hi + span * frac)
        };
        // The legend goes in the lower right, where training curves (rising, then flat) leave
        // room, so the margins can stay small.
        (pad(x0, x1, 0.02), pad(y0, y1, 0.05))
    }

    fn draw(&self, root: &Root<'_>) -> DrawResult {
        root.fill(&WHITE)?;
        let ((x0, x1), (y0, y1)) = self.ranges();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, 28))
            .margin(20)
            .x_label_area_size(60)
            .y_label_area_size(90)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let xfmt = |v: &f64| decimals(*v, x1 - x0);
        let yfmt = |v: &f64| decimals(*v, y1 - y0);
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .axis_desc_style((FONT, 22))
            .label_style((FONT, 18))
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .draw()?;
        for (i, s) in self.series.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().map(|p| (p[0], p[1])),
                    c.stroke_width(2),
                ))?
                .label(s.name.as_str())
                .legend(legend_line(c));
        }
        for h in &self.hlines {
            let c = RGBColor(60, 60, 60);
            chart
                .draw_series(DashedLineSeries::new(
                    [(x0, h.y), (x1, h.y)],
                    10,
                    6,
                    c.stroke_width(2),
                ))?
                .label(h.label.as_str())
                .legend(legend_line(c));
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        Ok(())
    }
}

/// Reads `input` and writes its curves to `out` as a PNG of [`super::PLOT_SIZE`].
pub fn plot_curves(input: &Path, out: &Path) -> Result<(), ReportError> {
    let curves = Curves::load(input)?;
    register_font()?;
    render_png(out, |root| curves.draw(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn draws_curves_and_a_target_line() {
        let dir = tempfile::tempdir().unwrap();
        let doc = Curves {
            title: "accuracy against wall time".into(),
            x_label: "wall time (s)".into(),
            y_label: "test accuracy (%)".into(),
            series: (0..12)
                .map(|k| Series {
                    name: format!("side {k}"),
                    points: (0..50)
                        .map(|i| {
                            [
                                i as f64 * 3.0,
                                90.0 * (1.0 - (-(i as f64) / (5.0 + k as f64)).exp()),
                            ]
                        })
                        .collect(),
                })
                .collect(),
            hlines: vec![HLine {
                y: 80.0,
                label: "target".into(),
            }],
        };
        let input = write(dir.path(), "c.json", &serde_json::to_string(&doc).unwrap());
        let out = dir.path().join("c.png");
        plot_curves(&input, &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // One point, or every point at the same value, still has a drawable range.
        let flat =
            r#"{"title":"t","x_label":"x","y_label":"y","series":[{"name":"a","points":[[1,5]]}]}"#;
        plot_curves(
            &write(dir.path(), "f.json", flat),
            &dir.path().join("f.png"),
        )
        .unwrap();
    }

    #[test]
    fn refuses_what_it_cannot_draw_naming_the_file_and_the_fault() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("not json", "expected"),
            (
                r#"{"title":"t","x_label":"x","y_label":"y","series":[]}"#,
                "no series",
            ),
            (
                r#"{"title":"t","x_label":"x","y_label":"y","series":[{"name":"a","points":[]}]}"#,
                "series \"a\" has no points",
            ),
            (
                r#"{"title":"t","x_label":"x","y_label":"y","series":[{"name":"a","points":[[1,2],[3]]}]}"#,
                "expected",
            ),
            (
                r#"{"title":"t","x_label":"x","y_label":"y","series":[{"name":"a","points":[[1,2]]}],"colour":"red"}"#,
                "unknown field `colour`",
            ),
            (
                r#"{"title":"t","x_label":"x","y_label":"y","series":[{"name":"a","points":[[1,2]]}],"hlines":[{"y":1}]}"#,
                "missing field `label`",
            ),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let input = write(dir.path(), &format!("bad{i}.json"), text);
            let out = dir.path().join(format!("bad{i}.png"));
            let e = plot_curves(&input, &out).unwrap_err().to_string();
            assert!(e.contains(&format!("bad{i}.json")), "{e}");
            assert!(e.contains(want), "case {i}: {e}");
            assert!(!out.exists(), "case {i} wrote a picture");
        }
        // Non-finite numbers cannot be written in JSON; a document built in code can hold them.
        let doc = Curves {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Series {
                name: "a".into(),
                points: vec![[0.0, 1.0], [1.0, f64::NAN]],
            }],
            hlines: vec![],
        };
        assert!(doc.check().unwrap_err().contains("point 1"));
        let missing = plot_curves(&dir.path().join("absent.json"), &dir.path().join("x.png"));
        assert!(missing.unwrap_err().to_string().contains("absent.json"));
    }
}

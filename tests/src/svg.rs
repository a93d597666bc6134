//! Minimal SVG line plots for the benchmark reports (no plotting dependency): series
//! as polylines, vertical markers (handoff instants), shaded spans (no cell).

use std::fmt::Write;

/// One line.
pub struct Series {
    pub name: String,
    pub color: String,
    pub points: Vec<(f64, f64)>,
}

/// A vertical line at `x`.
pub struct Marker {
    pub x: f64,
    pub color: String,
}

/// A plot with axes from 0.
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
    /// Shaded x ranges (e.g. the MH had no cell).
    pub spans: Vec<(f64, f64)>,
    /// Fixed y maximum (None: from the data).
    pub y_max: Option<f64>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" tick step for a range.
fn step(range: f64) -> f64 {
    let raw = range / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(mag * 10.0)
}

impl Plot {
    pub fn render(&self) -> String {
        let (w, h) = (760.0, 300.0);
        let (l, r, t, b) = (60.0, 150.0, 30.0, 40.0);
        let pts = self.series.iter().flat_map(|s| s.points.iter());
        let x_max = pts
            .clone()
            .map(|p| p.0)
            .chain(self.markers.iter().map(|m| m.x))
            .fold(1e-9, f64::max);
        let y_max = self
            .y_max
            .unwrap_or_else(|| pts.map(|p| p.1).fold(1e-9, f64::max) * 1.1);
        let px = |x: f64| l + (x / x_max).clamp(0.0, 1.0) * (w - l - r);
        let py = |y: f64| h - b - (y / y_max).clamp(0.0, 1.0) * (h - t - b);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{l}\" y=\"18\" font-size=\"13\">{}</text>\n",
            esc(&self.title)
        );
        for &(a, z) in &self.spans {
            let _ = writeln!(
                s,
                "<rect x=\"{:.1}\" y=\"{t}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#eeeeee\"/>",
                px(a),
                (px(z) - px(a)).max(0.5),
                h - t - b
            );
        }
        // Axes and ticks.
        let _ = writeln!(
            s,
            "<path d=\"M{l} {t} V{} H{}\" stroke=\"black\" fill=\"none\"/>",
            h - b,
            w - r
        );
        let xs = step(x_max);
        let mut x = 0.0;
        while x <= x_max + 1e-9 {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                px(x),
                h - b + 14.0,
                trim(x)
            );
            x += xs;
        }
        let ys = step(y_max);
        let mut y = 0.0;
        while y <= y_max + 1e-9 {
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text><path d=\"M{l} {:.1} H{}\" stroke=\"#dddddd\"/>",
                l - 4.0,
                py(y) + 4.0,
                trim(y),
                py(y),
                w - r
            );
            y += ys;
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            (l + w - r) / 2.0,
            h - 6.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            "<text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">{}</text>",
            (t + h - b) / 2.0,
            (t + h - b) / 2.0,
            esc(&self.y_label)
        );
        for m in &self.markers {
            let _ = writeln!(
                s,
                "<path d=\"M{:.1} {t} V{}\" stroke=\"{}\" stroke-dasharray=\"3,3\"/>",
                px(m.x),
                h - b,
                m.color
            );
        }
        for (i, se) in self.series.iter().enumerate() {
            let d: Vec<String> = se
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.3\"/>",
                d.join(" "),
                se.color
            );
            let ly = t + 14.0 * i as f64 + 10.0;
            let _ = writeln!(
                s,
                "<path d=\"M{} {ly} h18\" stroke=\"{}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">{}</text>",
                w - r + 8.0,
                se.color,
                w - r + 30.0,
                ly + 4.0,
                esc(&se.name)
            );
        }
        s += "</svg>\n";
        s
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_series_markers_and_spans() {
        let p = Plot {
            title: "a < b".into(),
            x_label: "s".into(),
            y_label: "KB/s".into(),
            series: vec![Series {
                name: "I-TCP".into(),
                color: "#c00".into(),
                points: vec![(0.0, 0.0), (1.0, 200.0), (2.0, 100.0)],
            }],
            markers: vec![Marker {
                x: 1.5,
                color: "#00c".into(),
            }],
            spans: vec![(0.5, 0.7)],
            y_max: None,
        };
        let s = p.render();
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("a &lt; b"));
        assert!(s.contains("<polyline"));
        assert!(s.contains("stroke-dasharray"));
        assert!(s.contains("fill=\"#eeeeee\""));
        assert_eq!(step(10.0), 2.0);
    }
}

//! Line charts of a sweep, drawn with plotters: SVG or PNG by the file's extension, x on a
//! log2 axis, a legend. A design's variants (a name with a parenthesised suffix, as
//! `--algorithm` makes them) share the design's colour, dashed.

use std::path::Path;
use std::sync::Once;

use anyhow::{Context, anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// One line: its name and its (x, y) points.
pub(crate) type Series = (String, Vec<(f64, f64)>);

const SIZE: (u32, u32) = (880, 420);

/// The font every chart uses, shipped inside the binary (no system fonts needed).
const FONT: &str = "sans-serif";

/// Draws `series` to `path` (`.svg` or `.png`).
pub(crate) fn draw(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> anyhow::Result<()> {
    static FONTS: Once = Once::new();
    FONTS.call_once(|| {
        // DejaVu Sans is a valid font: registration cannot fail.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "svg" => {
            let area = SVGBackend::new(path, SIZE).into_drawing_area();
            plot(&area, title, x_label, y_label, series)?;
            area.present().map_err(|e| anyhow!("{e}"))
        }
        "png" => {
            let area = BitMapBackend::new(path, SIZE).into_drawing_area();
            plot(&area, title, x_label, y_label, series)?;
            area.present().map_err(|e| anyhow!("{e}"))
        }
        _ => bail!("want a .svg or .png file, not {}", path.display()),
    }
    .with_context(|| format!("writing {}", path.display()))
}

/// The design a series belongs to: its name before a parenthesised variant.
fn design_of(name: &str) -> &str {
    name.split(" (").next().unwrap_or(name)
}

fn plot<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    area.fill(&WHITE).map_err(e)?;
    let pts = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let x0 = pts().map(|(x, _)| x).fold(f64::INFINITY, f64::min);
    let x1 = pts().map(|(x, _)| x).fold(f64::NEG_INFINITY, f64::max);
    let (x0, x1) = if x0.is_finite() && x0 > 0.0 {
        (x0, x1.max(x0 * 2.0))
    } else {
        (1.0, 2.0)
    };
    let y1 = pts().map(|(_, y)| y).fold(0.0, f64::max);
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x0..x1).log_scale().base(2.0), 0.0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style((FONT, 12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(e)?;
    let mut designs: Vec<&str> = Vec::new();
    for (name, points) in series {
        let d = design_of(name);
        let k = designs.iter().position(|&x| x == d).unwrap_or_else(|| {
            designs.push(d);
            designs.len() - 1
        });
        let color = Palette99::pick(k).to_rgba();
        let style = color.stroke_width(2);
        let dashed = d != name.as_str();
        let drawn = if dashed {
            chart.draw_series(DashedLineSeries::new(points.iter().copied(), 6, 4, style))
        } else {
            chart.draw_series(LineSeries::new(points.iter().copied(), style))
        };
        drawn
            .map_err(e)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 12))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(points: Vec<(f64, f64)>) -> Vec<Series> {
        vec![
            ("a".into(), points.clone()),
            ("a (hier)".into(), points.clone()),
            ("b".into(), points),
        ]
    }

    #[test]
    fn svg_and_png_are_written_with_axes_and_a_legend() {
        let dir = std::env::temp_dir().join(format!("monel-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pts = vec![(64.0, 10.0), (128.0, 20.0), (1024.0, 15.0)];
        let svg = dir.join("c.svg");
        draw(
            &svg,
            "Bus bandwidth",
            "GPUs",
            "busbw (GB/s)",
            &lines(pts.clone()),
        )
        .unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..40.min(text.len())]);
        for want in ["Bus bandwidth", "GPUs", "busbw (GB/s)", "a (hier)"] {
            assert!(text.contains(want), "no {want:?} in the SVG");
        }
        // Tick labels on the log2 axis are the GPU counts.
        assert!(text.contains("\n1024\n"), "no x tick labels");
        let png = dir.join("c.png");
        draw(&png, "t", "x", "y", &lines(pts)).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(draw(&dir.join("c.pdf"), "t", "x", "y", &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn variants_share_their_design_and_empty_charts_draw() {
        assert_eq!(design_of("a (hier)"), "a");
        assert_eq!(design_of("b"), "b");
        let dir = std::env::temp_dir().join(format!("monel-chart-e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        draw(&dir.join("e.svg"), "t", "x", "y", &[]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

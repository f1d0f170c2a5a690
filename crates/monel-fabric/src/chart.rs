//! Line charts of a sweep (bus bandwidth and step time against size).

/// A line chart in SVG: one line per series of (x, y) points, x on a log2 axis.
pub fn svg_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let (w, h, l, r, t, b) = (880.0, 420.0, 70.0, 300.0, 40.0, 50.0);
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x.log2());
        x1 = x1.max(x.log2());
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let px = |x: f64| l + (x.log2() - x0) / (x1 - x0) * (w - l - r);
    let py = |y: f64| h - b - y / y1 * (h - t - b);
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f",
    ];
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n\
         <line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>\n",
        (w - r + l) / 2.0,
        esc(title),
        h - b,
        w - r,
        h - b,
        h - b,
        (w - r + l) / 2.0,
        h - 12.0,
        esc(x_label),
        (h - b + t) / 2.0,
        (h - b + t) / 2.0,
        esc(y_label)
    );
    for i in 0..=4 {
        let y = y1 * f64::from(i) / 4.0;
        s += &format!(
            "<line x1=\"{l}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{4:.3}</text>\n",
            py(y),
            w - r,
            l - 6.0,
            py(y) + 4.0,
            y
        );
    }
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x}</text>\n",
            px(x),
            h - b + 16.0
        );
    }
    // A variant of another series ("name (hier)" beside "name") takes its colour, dashed.
    let mut color_of: Vec<usize> = Vec::new();
    let mut fresh = 0;
    for (name, _) in series {
        let base = name
            .rsplit_once(" (")
            .and_then(|(b, _)| series.iter().position(|(n, _)| n == b));
        match base {
            Some(k) if k < color_of.len() => color_of.push(color_of[k]),
            _ => {
                color_of.push(fresh);
                fresh += 1;
            }
        }
    }
    for (i, (name, p)) in series.iter().enumerate() {
        let c = colors[color_of[i] % colors.len()];
        let dash = if color_of[..i].contains(&color_of[i]) {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let d: Vec<String> = p
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash} points=\"{}\"/>\n",
            d.join(" ")
        );
        for &(x, y) in p {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>\n",
                px(x),
                py(y)
            );
        }
        let ly = t + 10.0 + 18.0 * i as f64;
        s += &format!(
            "<line x1=\"{x1}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"{c}\" stroke-width=\"3\"{dash}/><text x=\"{tx}\" y=\"{ly}\">{name}</text>\n",
            x1 = w - r + 8.0,
            x2 = w - r + 26.0,
            y = ly - 4.0,
            tx = w - r + 30.0,
            name = esc(name)
        );
    }
    s + "</svg>\n"
}

"""The report: one self-contained HTML file (inline SVG and a little inline JS, nothing fetched) plus JSON."""

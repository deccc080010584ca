// nodeguard's incident page: draws the charts that nodeguard/remediation/incident_charts.py
// describes (the JSON in #nodeguard-charts) with Chart.js, synchronously (no animation), then
// writes on <body> what it drew, for a headless browser's --dump-dom to check:
//   data-charts   the number of charts drawn
//   data-series   every dataset's label, of every chart, as the Chart instances hold them (JSON)
//   data-painted  for each chart, whether its canvas has a pixel that is not transparent (JSON)
//   data-error    what went wrong, if anything did (the others are then absent)
(function () {
  "use strict";

  // A long name (a pod UID and container ID, with no cluster to name them) shortened in the
  // legend only: each part of it with no space and over 16 characters cut to its first 12.
  // The dataset keeps its whole name (the tooltip shows it).
  function shortLabels(chart) {
    var items = Chart.defaults.plugins.legend.labels.generateLabels(chart);
    items.forEach(function (item) {
      item.text = item.text.split("/").map(function (part) {
        return part.length > 16 && !/\s/.test(part) ? part.slice(0, 12) + "\u2026" : part;
      }).join("/");
    });
    return items;
  }

  function dataset(d, index) {
    var out = {
      label: d.label,
      data: d.points.map(function (p) { return { x: p[0], y: p[1] }; }),
      borderColor: d.color,
      backgroundColor: d.fill ? d.color + "b0" : d.color,
      borderWidth: d.victim ? 3 : d.marker ? 2 : 1.5,
      pointRadius: 0,
      pointHitRadius: 6,
      tension: 0,
      fill: d.fill ? (index === 0 ? "origin" : "-1") : false
    };
    if (d.dash) { out.borderDash = [8, 5]; }
    if (d.marker) { out.borderDash = [3, 3]; }
    return out;
  }

  function draw(spec) {
    var canvas = document.getElementById(spec.canvas);
    return new Chart(canvas, {
      type: "line",
      data: {
        datasets: spec.datasets.map(function (d, i) { return dataset(d, i); })
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        interaction: { mode: "nearest", axis: "x", intersect: false },
        scales: {
          x: {
            type: "linear",
            min: spec.x_min,
            max: spec.x_max,
            title: { display: true, text: spec.x_title }
          },
          y: {
            stacked: spec.stacked,
            beginAtZero: true,
            title: { display: true, text: spec.unit }
          }
        },
        plugins: {
          title: { display: true, text: spec.title, font: { size: 15 } },
          legend: { position: "bottom", labels: { generateLabels: shortLabels } },
          tooltip: {
            callbacks: {
              label: function (ctx) {
                return ctx.dataset.label + ": " + ctx.parsed.y + " " + spec.unit;
              }
            }
          }
        }
      }
    });
  }

  function painted(chart) {
    var canvas = chart.canvas;
    if (!canvas.width || !canvas.height) { return false; }
    var pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    for (var i = 3; i < pixels.length; i += 4) {
      if (pixels[i] !== 0) { return true; }
    }
    return false;
  }

  try {
    var specs = JSON.parse(document.getElementById("nodeguard-charts").textContent);
    var charts = specs.map(draw);
    var labels = [];
    charts.forEach(function (chart) {
      chart.data.datasets.forEach(function (d) { labels.push(d.label); });
    });
    document.body.setAttribute("data-charts", String(charts.length));
    document.body.setAttribute("data-series", JSON.stringify(labels));
    document.body.setAttribute("data-painted", JSON.stringify(charts.map(painted)));
  } catch (error) {
    document.body.setAttribute("data-error", String(error && error.stack || error));
  }
})();

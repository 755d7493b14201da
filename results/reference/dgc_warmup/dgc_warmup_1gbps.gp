# Written by `terse compare --out`: test accuracy against wire bytes per worker (log scale) and against
# wall time for study dgc_warmup_1gbps, one line per variant. Data: dgc_warmup_1gbps.dat (one block per variant,
# columns wire bytes, wall s, accuracy, step). Edit freely and rerun `gnuplot dgc_warmup_1gbps.gp` in this folder.
stem = 'dgc_warmup_1gbps'
data = stem . '.dat'
target = 0.85
array names[4]
array colors[4]
array widths[4]
array dashes[4]
names[1] = 'dgc-0.1pct (mean of 3 seeds)'; colors[1] = '#9400d3'; widths[1] = 1.5; dashes[1] = 1
names[2] = 'dgc-0.1pct-warm100 (mean of 3 seeds)'; colors[2] = '#009e73'; widths[2] = 1.5; dashes[2] = 1
names[3] = 'dgc-0.1pct-warm469 (mean of 3 seeds)'; colors[3] = '#56b4e9'; widths[3] = 1.5; dashes[3] = 1
names[4] = 'dense (mean of 3 seeds) (baseline)'; colors[4] = 'black'; widths[4] = 3; dashes[4] = 1
set key outside right top noenhanced
set grid
set ylabel 'test accuracy'
set style data linespoints
# From the data (plot.h, accuracyRange): points far below the weakest line's best leave the plot
# downwards. `set yrange [*:*]` shows every point.
set yrange [0.5908166667:0.8845166667]
if (target >= 0.5908166667 && target <= 0.8845166667) {
  set arrow 1 from graph 0, first target to graph 1, first target nohead dashtype 2 lc rgb 'gray40'
  set label 1 sprintf('target %g', target) at graph 0.01, first target offset 0, 0.6 tc rgb 'gray40'
}
# pngcairo draws nicer lines; the plain png terminal (libgd) is the fallback where cairo is missing.
png_term = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? 'pngcairo' : 'png'
do for [fmt in 'png svg'] {
  if (fmt eq 'png') { eval('set terminal ' . png_term . ' size 1200,700 noenhanced') } else { set terminal svg size 1200,700 noenhanced dynamic }
  set output stem . '_acc_vs_bytes.' . fmt
  set title 'study ' . stem . ': test accuracy vs wire bytes per worker' noenhanced
  set logscale x
  set format x '%.0s %cB'
  set xlabel 'wire bytes per worker (log scale)'
  plot for [i=1:|names|] data index (i-1) using 1:5:6 with filledcurves lc rgb colors[i] fs transparent solid 0.15 noborder notitle, \
       for [i=1:|names|] data index (i-1) using 1:3 lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) + 1 ps 0.7 title names[i]
  set output stem . '_acc_vs_time.' . fmt
  set title 'study ' . stem . ': test accuracy vs simulated time' noenhanced
  unset logscale x
  set format x '%g'
  set xlabel 'simulated time (s)'
  plot for [i=1:|names|] data index (i-1) using 2:5:6 with filledcurves lc rgb colors[i] fs transparent solid 0.15 noborder notitle, \
       for [i=1:|names|] data index (i-1) using 2:3 lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) + 1 ps 0.7 title names[i]
}
unset output

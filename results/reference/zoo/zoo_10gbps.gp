# Written by `terse compare --out`: test accuracy against wire bytes per worker (log scale) and against
# wall time for study zoo_10gbps, one line per variant. Data: zoo_10gbps.dat (one block per variant,
# columns wire bytes, wall s, accuracy, step). Edit freely and rerun `gnuplot zoo_10gbps.gp` in this folder.
stem = 'zoo_10gbps'
data = stem . '.dat'
target = 0.85
array names[17]
array colors[17]
array widths[17]
array dashes[17]
names[1] = 'powersgd-r4-ef (mean of 3 seeds)'; colors[1] = '#9400d3'; widths[1] = 1.5; dashes[1] = 1
names[2] = 'dgc-1pct (mean of 3 seeds)'; colors[2] = '#009e73'; widths[2] = 1.5; dashes[2] = 1
names[3] = 'onebit-ef (mean of 3 seeds)'; colors[3] = '#56b4e9'; widths[3] = 1.5; dashes[3] = 1
names[4] = 'terngrad (mean of 3 seeds)'; colors[4] = '#e69f00'; widths[4] = 1.5; dashes[4] = 1
names[5] = 'fp16 (mean of 3 seeds)'; colors[5] = '#0072b2'; widths[5] = 1.5; dashes[5] = 1
names[6] = 'qsgd-8bit (mean of 3 seeds)'; colors[6] = '#e51e10'; widths[6] = 1.5; dashes[6] = 1
names[7] = 'bf16 (mean of 3 seeds)'; colors[7] = '#a0522d'; widths[7] = 1.5; dashes[7] = 1
names[8] = 'natural (mean of 3 seeds)'; colors[8] = '#f0e442'; widths[8] = 1.5; dashes[8] = 1
names[9] = 'dense (mean of 3 seeds) (baseline)'; colors[9] = 'black'; widths[9] = 3; dashes[9] = 1
names[10] = 'onebit-meanabs-ef (mean of 3 seeds)'; colors[10] = '#9400d3'; widths[10] = 1.5; dashes[10] = 2
names[11] = 'threshold-ef (mean of 3 seeds)'; colors[11] = '#009e73'; widths[11] = 1.5; dashes[11] = 2
names[12] = 'topk-1pct-ef (mean of 3 seeds)'; colors[12] = '#56b4e9'; widths[12] = 1.5; dashes[12] = 2
names[13] = 'randomk-1pct-ef (mean of 3 seeds)'; colors[13] = '#e69f00'; widths[13] = 1.5; dashes[13] = 2
names[14] = 'topk-1pct (mean of 3 seeds)'; colors[14] = '#0072b2'; widths[14] = 1.5; dashes[14] = 2
names[15] = 'signsgd (mean of 3 seeds)'; colors[15] = '#e51e10'; widths[15] = 1.5; dashes[15] = 2
names[16] = 'randomk-1pct (mean of 3 seeds)'; colors[16] = '#a0522d'; widths[16] = 1.5; dashes[16] = 2
names[17] = 'onebit (mean of 3 seeds)'; colors[17] = '#f0e442'; widths[17] = 1.5; dashes[17] = 2
set key outside right top noenhanced
set grid
set ylabel 'test accuracy'
set style data linespoints
# From the data (plot.h, accuracyRange): points far below the weakest line's best leave the plot
# downwards. `set yrange [*:*]` shows every point.
set yrange [0.27622:0.90058]
if (target >= 0.27622 && target <= 0.90058) {
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

# Written by `terse compare --out`: test accuracy against wire bytes per worker (log scale) and against
# wall time for study zoo_10gbps, one line per variant. Data: zoo_10gbps.dat (one block per variant,
# columns wire bytes, wall s, accuracy, step). Edit freely and rerun `gnuplot zoo_10gbps.gp` in this folder.
stem = 'zoo_10gbps'
data = stem . '.dat'
target = 0.85
array names[15]
names[1] = 'powersgd-r4-ef'
names[2] = 'dgc-1pct'
names[3] = 'topk-1pct-ef'
names[4] = 'threshold-ef'
names[5] = 'onebit-ef'
names[6] = 'terngrad'
names[7] = 'qsgd-8bit'
names[8] = 'bf16'
names[9] = 'fp16'
names[10] = 'dense (baseline)'
names[11] = 'topk-1pct'
names[12] = 'randomk-1pct'
names[13] = 'signsgd'
names[14] = 'onebit'
names[15] = 'randomk-1pct-ef'
set key outside right top noenhanced
set grid
set ylabel 'test accuracy'
set style data linespoints
# Runs that diverge would squash the interesting range; they still show, leaving the plot downwards.
# `set yrange [*:*]` shows every point.
set yrange [(target > 0.25 ? target - 0.25 : 0):*]
set arrow 1 from graph 0, first target to graph 1, first target nohead dashtype 2 lc rgb 'gray40'
set label 1 sprintf('target %g', target) at graph 0.01, first target offset 0, 0.6 tc rgb 'gray40'
# pngcairo draws nicer lines; the plain png terminal (libgd) is the fallback where cairo is missing.
# Eight colours repeat: the second eight lines are dashed, the third dotted.
style(i) = ((i - 1) / 8) % 3 + 1
png_term = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? 'pngcairo' : 'png'
do for [fmt in 'png svg'] {
  if (fmt eq 'png') { eval('set terminal ' . png_term . ' size 1200,700 noenhanced') } else { set terminal svg size 1200,700 noenhanced dynamic }
  set output stem . '_acc_vs_bytes.' . fmt
  set title 'study ' . stem . ': test accuracy vs wire bytes per worker' noenhanced
  set logscale x
  set format x '%.0s %cB'
  set xlabel 'wire bytes per worker (log scale)'
  plot for [i=1:|names|] data index (i-1) using 1:3 lw 1.5 lc i dt style(i) pt (i % 13) + 1 ps 0.7 title names[i]
  set output stem . '_acc_vs_time.' . fmt
  set title 'study ' . stem . ': test accuracy vs simulated time' noenhanced
  unset logscale x
  set format x '%g'
  set xlabel 'simulated time (s)'
  plot for [i=1:|names|] data index (i-1) using 2:3 lw 1.5 lc i dt style(i) pt (i % 13) + 1 ps 0.7 title names[i]
}
unset output

# Written by `terse compare --out`: study grid_link_workers across its grid, along link.bandwidth:
# one line per variant (and value of the other axes). Data: grid_link_workers_across_grid.dat. Edit freely and rerun `gnuplot grid_link_workers_across_grid.gp` in this folder.
stem = 'grid_link_workers_across_grid'
data = stem . '.dat'
array names[8]
array colors[8]
array widths[8]
array dashes[8]
names[1] = 'topk-1pct-ef (workers=4)'; colors[1] = '#9400d3'; widths[1] = 1.5; dashes[1] = 1
names[2] = 'onebit-ef (workers=4)'; colors[2] = '#009e73'; widths[2] = 1.5; dashes[2] = 1
names[3] = 'fp16 (workers=4)'; colors[3] = '#56b4e9'; widths[3] = 1.5; dashes[3] = 1
names[4] = 'dense (workers=4) (baseline)'; colors[4] = 'black'; widths[4] = 3; dashes[4] = 1
names[5] = 'topk-1pct-ef (workers=8)'; colors[5] = '#9400d3'; widths[5] = 1.5; dashes[5] = 2
names[6] = 'onebit-ef (workers=8)'; colors[6] = '#009e73'; widths[6] = 1.5; dashes[6] = 2
names[7] = 'fp16 (workers=8)'; colors[7] = '#56b4e9'; widths[7] = 1.5; dashes[7] = 2
names[8] = 'dense (workers=8) (baseline)'; colors[8] = 'black'; widths[8] = 3; dashes[8] = 2
set xtics ('1Gbps' 0, '10Gbps' 1, '100Gbps' 2) noenhanced
set xrange [-0.5:2.5]
set xlabel 'link.bandwidth' noenhanced
set key outside right top noenhanced
set grid
set style data linespoints
png_term = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? 'pngcairo' : 'png'
do for [fmt in 'png svg'] {
  if (fmt eq 'png') { eval('set terminal ' . png_term . ' size 1200,700 noenhanced') } else { set terminal svg size 1200,700 noenhanced dynamic }
  set output stem . '_speedup.' . fmt
  set title 'study grid_link_workers: speedup in time to 0.8 over the point''s baseline (x)' noenhanced
  set ylabel 'speedup in time to 0.8 over the point''s baseline (x)' noenhanced
  plot for [i=1:|names|] data index (i-1) using 1:2 lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) + 1 ps 1 title names[i]
  set output stem . '_final_accuracy.' . fmt
  set title 'study grid_link_workers: final test accuracy' noenhanced
  set ylabel 'final test accuracy' noenhanced
  plot for [i=1:|names|] data index (i-1) using 1:3 lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) + 1 ps 1 title names[i]
  set output stem . '_wire_ratio.' . fmt
  set title 'study grid_link_workers: the baseline''s wire bytes per step / the variant''s (x)' noenhanced
  set ylabel 'the baseline''s wire bytes per step / the variant''s (x)' noenhanced
  plot for [i=1:|names|] data index (i-1) using 1:4 lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) + 1 ps 1 title names[i]
}
unset output

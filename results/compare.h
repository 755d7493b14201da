// `terse compare`'s library (DESIGN.md section 7), the one header the command line includes. It reads result folders
// back (compare/reader.h: forgiving, every problem a warning), turns one study's variants into a comparison table
// (compare/compute.h: the columns' definitions, the baseline, the row order), prints it and the provenance table as
// markdown, CSV or JSON (compare/format.h), and plots accuracy against bytes and time with gnuplot (compare/plot.h).
#pragma once

#include "results/compare/room.h"  // the room's guard

#include "results/compare/compute.h"
#include "results/compare/format.h"
#include "results/compare/plot.h"
#include "results/compare/reader.h"

// A study's grid (grid.h): axes parsed into overrides, points enumerated and named.
#include "experiments/config/grid.h"

#include <algorithm>
#include <map>

#include "experiments/config/config.h"
#include "experiments/config/config_checks.h"
#include "experiments/config/limits.h"

namespace terse::experiments {
namespace {

// Fields no axis may vary: the study's identity and folders, the repeats (seeds are their own axis, averaged over
// rather than tabled apart), and the grid itself. variant and variants are refused by parseFieldOverride.
constexpr std::pair<std::string_view, std::string_view> kNotAnAxis[] = {
    {"study", "the study names the results folder every point writes under"},
    {"output_dir", "every point of a study writes under one results root"},
    {"seed", "repeats over seeds are `seeds`, which terse compare averages into one row"},
    {"seeds", "repeats over seeds are `seeds`, which terse compare averages into one row"},
    {"grid", "axes do not nest"},
    {"grid_point", "the loader sets it"},
};

// A value as variant names spell it (grid.h, "Names").
std::string nameOfValue(std::string_view value) {
  std::string out;
  bool gap = false;
  for (const char c : value) {
    const bool keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!keep) {
      gap = true;
      continue;
    }
    if (gap && !out.empty()) out += '_';
    gap = false;
    out += c;
  }
  return out;
}

std::string defaultLabel(const std::string& path) {
  const std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

}  // namespace

bool setsField(const Experiment& e, const FieldOverride& o) {
  namespace pb = google::protobuf;
  const pb::Message* m = &e;
  std::string walked;  // the path down to the field set: a map entry's key is what follows it
  for (std::size_t i = 0; i + 1 < o.fields.size(); ++i) {
    if (!m->GetReflection()->HasField(*m, o.fields[i])) return false;
    m = &m->GetReflection()->GetMessage(*m, o.fields[i]);
    walked += (walked.empty() ? "" : ".") + o.fields[i]->name();
  }
  const pb::FieldDescriptor* f = o.fields.back();
  const pb::Reflection* r = m->GetReflection();
  if (!f->is_repeated()) return r->HasField(*m, f);
  if (!o.map_entry) return r->FieldSize(*m, f) > 0;
  walked += (walked.empty() ? "" : ".") + f->name();
  const std::string key = o.path.substr(std::min(o.path.size(), walked.size() + 1));
  const pb::FieldDescriptor* key_field = f->message_type()->map_key();
  for (int i = 0; i < r->FieldSize(*m, f); ++i) {
    const pb::Message& entry = r->GetRepeatedMessage(*m, f, i);
    if (entry.GetReflection()->GetString(entry, key_field) == key) return true;
  }
  return false;
}

bool pathsOverlap(std::string_view a, std::string_view b) {
  if (a.size() > b.size()) std::swap(a, b);
  return b.starts_with(a) && (b.size() == a.size() || b[a.size()] == '.');
}

GridAxis parseGridOption(std::string_view text) {
  const std::string where = "--grid " + std::string(text);
  auto refuse = [&](const std::string& problem) {
    throw ConfigError("--grid: " + where + ": " + problem, "--grid", {where + ": " + problem});
  };
  const std::size_t eq = text.find('=');
  if (eq == std::string_view::npos)
    refuse(
        "expected PATH=V1,V2,... (a field of the experiment and its values), e.g. --grid link.bandwidth=1Gbps,10Gbps");
  if (eq == 0) refuse("no field path before '=', e.g. --grid workers=2,4,8");
  GridAxis axis;
  axis.set_path(std::string(text.substr(0, eq)));
  // Commas inside brackets, braces or quotes belong to the value: `[64, 32]` is one list.
  int depth = 0;
  char quote = 0;
  std::string value;
  auto push = [&] {
    if (value.empty()) refuse("an empty value; give the values separated by single commas");
    axis.add_values(value);
    value.clear();
  };
  for (std::size_t i = eq + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == '\\' && i + 1 < text.size()) {
        value += c;
        value += text[++i];
        continue;
      }
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ',' && depth == 0) {
      push();
      continue;
    }
    value += c;
  }
  push();
  return axis;
}

void mergeGridOptions(Experiment& file, const std::vector<GridAxis>& extra, const std::vector<std::string>& texts,
                      std::vector<std::string>& where) {
  where.assign(static_cast<std::size_t>(file.grid_size()), std::string());
  std::vector<std::string> errors;
  for (std::size_t k = 0; k < extra.size(); ++k) {
    const std::string option = "--grid " + (k < texts.size() ? texts[k] : extra[k].path());
    for (std::size_t j = 0; j < k; ++j)
      if (extra[j].path() == extra[k].path())
        errors.push_back(option + ": " + extra[k].path() + " is already an axis by --grid " +
                         (j < texts.size() ? texts[j] : extra[j].path()) + "; give each axis once");
    int same = -1;
    for (int i = 0; i < file.grid_size(); ++i)
      if (file.grid(i).path() == extra[k].path()) same = i;
    if (extra[k].values_size() > limits::kGridValues)
      errors.push_back(option + ": " + std::to_string(extra[k].values_size()) +
                       " values, more than an axis may have (" + std::to_string(limits::kGridValues) + ")");
    if (same >= 0) {
      // The file's axis keeps its place and label; its values are the command line's.
      *file.mutable_grid(same)->mutable_values() = extra[k].values();
      where[static_cast<std::size_t>(same)] = option;
    } else {
      *file.add_grid() = extra[k];
      where.push_back(option);
    }
  }
  if (errors.empty() && file.grid_size() > limits::kGridAxes)
    errors.push_back("--grid: " + std::to_string(file.grid_size()) +
                     " axes with the config's, more than a study may "
                     "have (" +
                     std::to_string(limits::kGridAxes) + ")");
  if (!errors.empty()) {
    const std::string message = "--grid: " + errors.front();  // before errors is moved from
    throw ConfigError(message, "--grid", std::move(errors));
  }
}

std::vector<ResolvedAxis> resolveGridAxes(const Experiment& file, const GridWhere& where,
                                          std::vector<std::string>& errors) {
  std::vector<ResolvedAxis> axes;
  for (int i = 0; i < file.grid_size(); ++i) {
    const GridAxis& a = file.grid(i);
    const std::string w = where(i, -1);
    if (a.path().empty()) {
      errors.push_back(w + ": path must be set (the field the axis varies, e.g. \"link.bandwidth\")");
      continue;
    }
    const std::string first = a.path().substr(0, a.path().find('.'));
    const auto refused =
        std::find_if(std::begin(kNotAnAxis), std::end(kNotAnAxis), [&](const auto& r) { return r.first == first; });
    if (refused != std::end(kNotAnAxis)) {
      errors.push_back(w + ": " + a.path() + " cannot be an axis: " + std::string(refused->second));
      continue;
    }
    if (a.values_size() == 0) {
      errors.push_back(w + ": " + a.path() + " has no values; give at least one");
      continue;
    }
    ResolvedAxis r;
    r.path = a.path();
    r.label = a.has_label() ? a.label() : defaultLabel(a.path());
    if (!isFolderName(r.label))
      errors.push_back(w + ": label must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got " +
                       experiments::quoted(r.label) + (a.has_label() ? "" : " (the path's last part; give a label)"));
    bool ok = true;
    std::map<std::string, int> by_value, by_name;
    // A problem of the path (an unknown field) comes up for every value alike: said once, of the axis.
    std::vector<std::pair<std::string, std::string>> problems;  // (what, the error as the value's parse gave it)
    for (int j = 0; j < a.values_size(); ++j) {
      const std::string& value = a.values(j);
      const std::string vw = where(i, j);
      try {
        FieldOverride o = parseFieldOverride(a.path() + "=" + value, vw);
        o.where = vw + " (" + a.path() + "=" + value + ")";
        r.overrides.push_back(std::move(o));
      } catch (const ConfigError& e) {
        const std::string prefix = vw + " " + a.path() + "=" + value + ": ";
        for (const auto& error : e.errors())
          problems.emplace_back(error.starts_with(prefix) ? error.substr(prefix.size()) : error, error);
        ok = false;
        continue;
      }
      if (const auto [it, fresh] = by_value.emplace(value, j); !fresh) {
        errors.push_back(vw + ": " + experiments::quoted(value) + " repeats values[" + std::to_string(it->second) +
                         "]");
        ok = false;
        continue;
      }
      const std::string name = nameOfValue(value);
      if (name.empty()) {
        errors.push_back(vw + ": " + experiments::quoted(value) +
                         " has no character a folder name may hold ([A-Za-z0-9._-])");
        ok = false;
      } else if (const auto [it, fresh] = by_name.emplace(name, j); !fresh) {
        errors.push_back(vw + ": " + experiments::quoted(value) + " and values[" + std::to_string(it->second) + "] " +
                         experiments::quoted(a.values(it->second)) + " both become " + experiments::quoted(name) +
                         " in variant names, so their runs would share a folder");
        ok = false;
      }
      r.values.push_back(value);
      r.names.push_back(name);
    }
    for (std::size_t p = 0; p < problems.size(); ++p) {
      const auto same = [&](const auto& q) { return q.first == problems[p].first; };
      if (std::any_of(problems.begin(), problems.begin() + static_cast<std::ptrdiff_t>(p), same)) continue;
      const bool shared = std::count_if(problems.begin(), problems.end(), same) > 1;
      errors.push_back(shared ? w + ": " + problems[p].first : problems[p].second);
    }
    if (!ok) continue;
    for (std::size_t b = 0; b < axes.size(); ++b) {
      if (pathsOverlap(axes[b].path, r.path)) {
        errors.push_back(w + ": " + r.path + " overlaps the axis of " + axes[b].path +
                         "; each field may be varied by one axis");
        ok = false;
      } else if (axes[b].label == r.label) {
        errors.push_back(w + ": label " + experiments::quoted(r.label) + " is also " + axes[b].path +
                         "'s; give the axes distinct labels (grid[].label)");
        ok = false;
      }
    }
    if (ok) axes.push_back(std::move(r));
  }
  return axes;
}

std::vector<ResolvedAxis> resolveGridAxes(const Experiment& file) {
  std::vector<std::string> errors;
  auto axes = resolveGridAxes(
      file,
      [](int axis, int value) {
        return "grid[" + std::to_string(axis) + "]" + (value < 0 ? "" : ".values[" + std::to_string(value) + "]");
      },
      errors);
  if (!errors.empty()) {
    const std::string message = "grid: " + errors.front();  // before errors is moved from
    throw ConfigError(message, "grid", std::move(errors));
  }
  return axes;
}

std::size_t gridPoints(const std::vector<ResolvedAxis>& axes) {
  std::size_t n = 1;
  for (const auto& a : axes) n *= a.values.size();
  return n;
}

std::vector<std::size_t> gridCoordinates(const std::vector<ResolvedAxis>& axes, std::size_t point) {
  std::vector<std::size_t> c(axes.size());
  for (std::size_t a = axes.size(); a-- > 0;) {
    c[a] = point % axes[a].values.size();
    point /= axes[a].values.size();
  }
  return c;
}

std::string gridPointLabel(const std::vector<ResolvedAxis>& axes, std::size_t point) {
  const auto c = gridCoordinates(axes, point);
  std::string out;
  for (std::size_t a = 0; a < axes.size(); ++a) out += (a ? ", " : "") + axes[a].path + "=" + axes[a].values[c[a]];
  return out;
}

void placeAtGridPoint(Experiment& e, const std::string& variant, const std::vector<ResolvedAxis>& axes,
                      std::size_t point) {
  if (axes.empty()) return;
  const auto c = gridCoordinates(axes, point);
  std::string name = variant;
  GridPoint* p = e.mutable_grid_point();
  p->Clear();
  p->set_variant(variant);
  for (std::size_t a = 0; a < axes.size(); ++a) {
    applyFieldOverride(e, axes[a].overrides[c[a]]);
    GridCoordinate* coordinate = p->add_coordinates();
    coordinate->set_path(axes[a].path);
    coordinate->set_label(axes[a].label);
    coordinate->set_value(axes[a].values[c[a]]);
    name += "." + axes[a].label + "-" + axes[a].names[c[a]];
  }
  e.set_variant(name);
}

}  // namespace terse::experiments

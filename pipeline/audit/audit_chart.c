/* audit_chart.c — audit.svg: growth panels (log-log: measured points, the cost model with its band, the measured
 * range and the limit past which the model stands alone) above the savings bars. Every position is computed from an estimate of the text's
 * width, so no label leaves the canvas (tests/integration/audit/test_audit_scale.sh renders it and checks). */
#include "pipeline/audit/audit.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (cap < b->n + (size_t)w + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

double dfm_audit_text_width(const char *s, double size, int bold) {
    /* per-character advance of DejaVu Sans (the usual sans-serif on Linux), rounded up by class */
    double w = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if ((*c & 0xC0) == 0x80) continue; /* UTF-8 continuation byte */
        double a;
        if (*c >= '0' && *c <= '9') a = 0.64;
        else if (*c >= 'A' && *c <= 'Z') a = 0.74;
        else if (strchr("il.,:;'|!", *c)) a = 0.32;
        else if (*c == ' ') a = 0.33;
        else if (strchr("mwMW%", *c)) a = 0.98;
        else a = 0.64;
        w += a;
    }
    return w * size * (bold ? 1.1 : 1.0) * 1.04;
}

static void text_el(sbuf *b, double x, double y, const char *anchor, double size, int bold, const char *fill, const char *s) {
    sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%.0f\"%s fill=\"%s\">", x, y, anchor, size,
              bold ? " font-weight=\"bold\"" : "", fill);
    for (; *s; s++) {
        if (*s == '<') sb_printf(b, "&lt;");
        else if (*s == '>') sb_printf(b, "&gt;");
        else if (*s == '&') sb_printf(b, "&amp;");
        else sb_printf(b, "%c", *s);
    }
    sb_printf(b, "</text>\n");
}

static const char *COL[DFM_AUDIT_SIDES] = {"#2b6cb0", "#c05621", "#38a169"}; /* chunk level, token level, chunk level IVF-PQ */

/* a decade tick label: 1e-3 ... 1e12 */
static void decade(int d, char *buf, size_t n) { snprintf(buf, n, "1e%d", d); }

static double panel_height(void) { return 250; }

/* one growth panel at (x0, y0), w wide: the measured range shaded, the defensible limit, each side's band, model and points */
static void draw_panel(sbuf *b, const dfm_audit_panel *p, double x0, double y0, double w, double x_lo, const dfm_audit_range *r) {
    const double fs = 11, H = panel_height();
    double x_hi = r->x_hi;
    double y_lo = INFINITY, y_hi = -INFINITY;
    for (int s = 0; s < DFM_AUDIT_SIDES; s++) {
        const dfm_audit_series *sr = &p->side[s];
        for (int i = 0; i < sr->n; i++)
            if (sr->y[i] > 0) y_lo = fmin(y_lo, sr->y[i]), y_hi = fmax(y_hi, sr->y[i]);
        for (int i = 0; i < sr->m; i++) {
            if (sr->lo[i] > 0) y_lo = fmin(y_lo, sr->lo[i]);
            if (sr->hi[i] > 0) y_hi = fmax(y_hi, sr->hi[i]);
        }
    }
    if (!(y_lo < INFINITY)) y_lo = 1, y_hi = 10;
    int dy0 = (int)floor(log10(y_lo)), dy1 = (int)ceil(log10(y_hi)), dx0 = (int)floor(log10(x_lo)), dx1 = (int)ceil(log10(x_hi));
    if (dy1 <= dy0) dy1 = dy0 + 1;
    if (dx1 <= dx0) dx1 = dx0 + 1;
    char lab[32], wide[32];
    decade(dy0 < 0 ? dy0 : dy1, wide, sizeof wide);
    double tick_w = fmax(dfm_audit_text_width(wide, fs, 0), dfm_audit_text_width("1e-10", fs, 0));
    double pl = x0 + tick_w + 8, pr = x0 + w - dfm_audit_text_width("1e10", fs, 0) / 2 - 4;
    double pt = y0 + 34, pb = y0 + H - 34;
    text_el(b, x0 + w / 2, y0 + 14, "middle", 12, 1, "#222", p->title);
    text_el(b, x0 + w / 2, y0 + 28, "middle", fs, 0, "#555", p->unit);
#define PX(v) (pl + (pr - pl) * (log10(v) - dx0) / (double)(dx1 - dx0))
#define PY(v) (pb - (pb - pt) * (log10(v) - dy0) / (double)(dy1 - dy0))
    /* the measured (validated) range, and the limit past which the model stands alone */
    if (r->measured_hi > 0 && r->measured_lo > 0)
        sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f1f5e9\"><title>measured: the model is validated on "
                     "the largest size</title></rect>\n",
                  PX(r->measured_lo), pt, PX(r->measured_hi) - PX(r->measured_lo), pb - pt);
    int ystep = (dy1 - dy0) > 8 ? 2 : 1, xstep = (dx1 - dx0) > 6 ? 2 : 1;
    for (int d = dy0; d <= dy1; d += ystep) {
        double y = PY(pow(10, d));
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/>\n", pl, y, pr, y);
        decade(d, lab, sizeof lab);
        text_el(b, pl - 4, y + 4, "end", fs, 0, "#555", lab);
    }
    for (int d = dx0; d <= dx1; d += xstep) {
        double x = PX(pow(10, d));
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/>\n", x, pt, x, pb);
        decade(d, lab, sizeof lab);
        text_el(b, x, pb + 14, "middle", fs, 0, "#555", lab);
    }
    text_el(b, (pl + pr) / 2, pb + 28, "middle", fs, 0, "#555", "corpus tokens");
    if (r->defensible > x_lo && r->defensible < x_hi) {
        double xd = PX(r->defensible);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" stroke-dasharray=\"2,3\"><title>beyond: the model "
                     "only</title></line>\n",
                  xd, pt, xd, pb);
        if (xd + 4 + dfm_audit_text_width("model only", 10, 0) < pr) text_el(b, xd + 4, pt + 12, "start", 10, 0, "#777", "model only");
    }
    if (r->measured_hi > 0) text_el(b, PX(r->measured_lo) + 3, pt + 12, "start", 10, 0, "#5a7d2a", "measured");
    sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n", pl, pt, pr - pl, pb - pt);
    for (int s = 0; s < DFM_AUDIT_SIDES; s++) {
        const dfm_audit_series *sr = &p->side[s];
        if (sr->m >= 2) {
            /* the band: a polygon along hi, back along lo */
            sb_printf(b, "<polygon fill=\"%s\" fill-opacity=\"0.12\" stroke=\"none\" points=\"", COL[s]);
            for (int i = 0; i < sr->m; i++) sb_printf(b, "%.1f,%.1f ", PX(sr->mx[i]), PY(sr->hi[i]));
            for (int i = sr->m - 1; i >= 0; i--) sb_printf(b, "%.1f,%.1f ", PX(sr->mx[i]), PY(sr->lo[i]));
            sb_printf(b, "\"><title>uncertainty band of the model</title></polygon>\n");
            /* the model: solid up to the largest measured size, dashed beyond */
            for (int pass = 0; pass < 2; pass++) {
                sb_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", COL[s], pass ? " stroke-dasharray=\"5,4\"" : "");
                double lim = r->measured_hi * (1 + 1e-9);
                for (int i = 0; i < sr->m; i++) {
                    int beyond = sr->mx[i] > lim, next_beyond = i + 1 < sr->m && sr->mx[i + 1] > lim;
                    if (pass ? beyond || next_beyond : !beyond) sb_printf(b, "%.1f,%.1f ", PX(sr->mx[i]), PY(sr->my[i]));
                }
                sb_printf(b, "\"/>\n");
            }
        }
        for (int i = 0; i < sr->n; i++)
            if (sr->y[i] > 0 && sr->x[i] > 0)
                sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.2\" fill=\"%s\"><title>measured: %.6g at %.6g tokens</title></circle>\n", PX(sr->x[i]),
                          PY(sr->y[i]), COL[s], sr->y[i], sr->x[i]);
    }
#undef PX
#undef PY
}

int dfm_audit_write_chart(const char *path, const char *title, const dfm_audit_panel *panels, int n_panels, const dfm_audit_range *range,
                          const char *note, const dfm_audit_bar *bars, int n_bars) {
    const double M = 16, fs = 12;
    char h[64];
    /* bars: the label column, the bar area, the value and the percentage columns, all from text widths */
    double lab_w = 0, val_w = 0, pct_w = dfm_audit_text_width("100000.000 % fewer", fs, 1);
    for (int i = 0; i < n_bars; i++) {
        lab_w = fmax(lab_w, dfm_audit_text_width(bars[i].label, fs, 1));
        lab_w = fmax(lab_w, dfm_audit_text_width(bars[i].unit, fs, 0));
        for (int s = 0; s < 2; s++)
            val_w = fmax(val_w, dfm_audit_text_width(bars[i].chunk > 0 || s ? dfm_audit_human(s ? bars[i].token : bars[i].chunk, h, sizeof h) : "n/a", fs, 0));
    }
    val_w = fmax(val_w, dfm_audit_text_width("n/a", fs, 0));
    double legend_w = dfm_audit_text_width("chunk level (DFM)", fs, 0) + dfm_audit_text_width("token level (one query per token, k per query)", fs, 0) +
                      dfm_audit_text_width("chunk level in IVF-PQ (curves; like for like)", fs, 0) + 120;
    double W = fmax(960, M + lab_w + 12 + 380 + 8 + val_w + 16 + pct_w + M);
    W = fmax(W, 2 * M + dfm_audit_text_width(title, 15, 1));
    W = fmax(W, 2 * M + legend_w);
    if (note) W = fmax(W, 2 * M + dfm_audit_text_width(note, 11, 0));
    double bar_l = M + lab_w + 12, bar_w = W - M - pct_w - 16 - val_w - 8 - bar_l;
    const double group_h = 62, bar_h = 20;
    double y_cursor = 56;
    double panels_top = y_cursor;
    if (n_panels > 0) y_cursor += panel_height() + 10;
    double bars_top = y_cursor + 8;
    double H = bars_top + n_bars * group_h + 46 + (note ? 18 : 0) + M;

    sbuf b = {0};
    sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    sb_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, sans-serif\">\n",
              W, H, W, H);
    sb_printf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    text_el(&b, M, 24, "start", 15, 1, "#111", title);
    double lx = M;
    sb_printf(&b, "<rect x=\"%.1f\" y=\"34\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx, COL[0]);
    text_el(&b, lx + 16, 45, "start", fs, 0, "#222", "chunk level (DFM)");
    lx += 16 + dfm_audit_text_width("chunk level (DFM)", fs, 0) + 24;
    sb_printf(&b, "<rect x=\"%.1f\" y=\"34\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx, COL[1]);
    text_el(&b, lx + 16, 45, "start", fs, 0, "#222", "token level (one query per token, k per query)");
    if (n_panels > 0) {
        lx += 16 + dfm_audit_text_width("token level (one query per token, k per query)", fs, 0) + 24;
        sb_printf(&b, "<rect x=\"%.1f\" y=\"34\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx, COL[2]);
        text_el(&b, lx + 16, 45, "start", fs, 0, "#222", "chunk level in IVF-PQ (curves; like for like)");
    }

    if (n_panels > 0) {
        double x_lo = INFINITY;
        for (int i = 0; i < n_panels; i++)
            for (int s = 0; s < DFM_AUDIT_SIDES; s++)
                for (int j = 0; j < panels[i].side[s].n; j++) x_lo = fmin(x_lo, panels[i].side[s].x[j]);
        if (!(x_lo < INFINITY) || x_lo <= 0) x_lo = 1;
        dfm_audit_range r = range ? *range : (dfm_audit_range){0, 0, 0, 0};
        if (!(r.x_hi > x_lo)) r.x_hi = x_lo * 10;
        double gap = 14, pw = (W - 2 * M - gap * (n_panels - 1)) / n_panels;
        for (int i = 0; i < n_panels; i++) draw_panel(&b, &panels[i], M + i * (pw + gap), panels_top, pw, x_lo, &r);
    }

    /* savings bars on a shared log10 axis */
    double vmax = 1;
    int dec_lo = 0;
    for (int i = 0; i < n_bars; i++) {
        vmax = fmax(vmax, fmax(bars[i].chunk, bars[i].token));
        double lo = bars[i].chunk > 0 && bars[i].chunk < bars[i].token ? bars[i].chunk : bars[i].token;
        if (lo > 0 && floor(log10(lo)) < dec_lo) dec_lo = (int)floor(log10(lo));
    }
    int dec_hi = (int)ceil(log10(vmax));
    if (dec_hi <= dec_lo) dec_hi = dec_lo + 1;
    double span = dec_hi - dec_lo, y_axis = bars_top + n_bars * group_h + 4;
    int step = span > 12 ? 2 : 1;
    for (int d = dec_lo; d <= dec_hi; d += step) {
        double x = bar_l + bar_w * (d - dec_lo) / span;
        char lab[32];
        decade(d, lab, sizeof lab);
        sb_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/>\n", x, bars_top - 6, x, y_axis);
        text_el(&b, x, y_axis + 15, "middle", 11, 0, "#555", lab);
    }
    text_el(&b, bar_l + bar_w / 2, y_axis + 32, "middle", 11, 0, "#555", "log10 scale; the percentage is 1 - chunk / token");
    for (int i = 0; i < n_bars; i++) {
        double y = bars_top + i * group_h;
        text_el(&b, bar_l - 10, y + bar_h + 2, "end", fs, 1, "#222", bars[i].label);
        text_el(&b, bar_l - 10, y + bar_h + 17, "end", fs, 0, "#555", bars[i].unit);
        const double vals[2] = {bars[i].chunk, bars[i].token};
        for (int s = 0; s < 2; s++) {
            double v = vals[s], by = y + s * (bar_h + 4);
            double w = v > 0 ? bar_w * (log10(v) - dec_lo) / span : 0;
            if (w < 1 && v > 0) w = 1;
            sb_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.0f\" fill=\"%s\"><title>%.6g</title></rect>\n", bar_l, by, w,
                      bar_h, COL[s], v);
            text_el(&b, bar_l + w + 5, by + 14, "start", fs, 0, "#222", v > 0 ? dfm_audit_human(v, h, sizeof h) : "n/a");
        }
        if (vals[0] > 0 && vals[1] > 0) {
            char pc[48];
            dfm_audit_saving_words(1.0 - vals[0] / vals[1], 3, bars[i].less ? bars[i].less : "fewer", pc, sizeof pc);
            text_el(&b, W - M, y + bar_h + 4, "end", fs, 1, "#2f855a", pc);
        }
    }
    if (note) text_el(&b, M, H - M, "start", 11, 0, "#555", note);
    sb_printf(&b, "</svg>\n");
    if (b.oom) {
        free(b.p);
        return DFM_FAIL(DFM_ENOMEM, "audit: no memory for the chart %s", path);
    }
    int rc = dfm_write_file_atomic(path, b.p, b.n);
    free(b.p);
    return rc;
}

int dfm_audit_write_svg(const char *path, const char *title, const dfm_audit_bar *bars, int n_bars) {
    return dfm_audit_write_chart(path, title, NULL, 0, NULL, NULL, bars, n_bars);
}

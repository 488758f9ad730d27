/* Logging to stderr with a level threshold.
 *
 * The threshold comes from ag_log_set_level() or, at first use, from the
 * AUGUR_LOG environment variable (error|warn|info|debug). Default: warn, so
 * CLI tools stay quiet; the server raises it to info. Thread-safe: each call
 * writes one line with a single fprintf. */
#ifndef AG_BASE_LOG_H
#define AG_BASE_LOG_H

typedef enum { AG_LOG_ERROR = 0, AG_LOG_WARN, AG_LOG_INFO, AG_LOG_DEBUG } ag_log_level;

void ag_log_set_level(ag_log_level level);
int  ag_log_enabled(ag_log_level level);
void ag_log(ag_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define AG_LOGE(...) ag_log(AG_LOG_ERROR, __VA_ARGS__)
#define AG_LOGW(...) ag_log(AG_LOG_WARN, __VA_ARGS__)
#define AG_LOGI(...) ag_log(AG_LOG_INFO, __VA_ARGS__)
#define AG_LOGD(...) ag_log(AG_LOG_DEBUG, __VA_ARGS__)

#endif

# Installs the unit and the example configuration at install time, so their paths follow the
# prefix installed to (`cmake --install --prefix P`, CPack's /usr), not the one configured.
# Given by the install(CODE) that includes this: GRADSYNC_SOURCE_DIR, GRADSYNC_BINARY_DIR,
# GRADSYNC_UNIT_DIR (relative to the prefix), GRADSYNC_DOCDIR (relative).
#
# The configuration lives under /etc for the prefixes /usr and / (as Debian and the FHS want),
# else under PREFIX/etc; the unit names the same file. DESTDIR (CPack's staging) is honoured by
# file(INSTALL).
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr" OR prefix STREQUAL "/")
  set(GRADSYNC_CONFIG_DIR "/etc/gradsync")
else()
  set(GRADSYNC_CONFIG_DIR "${prefix}/etc/gradsync")
endif()
set(GRADSYNC_SBIN_DIR "${prefix}/sbin")
set(GRADSYNC_DOC_DIR "${prefix}/${GRADSYNC_DOCDIR}")
string(REPLACE "//" "/" GRADSYNC_SBIN_DIR "${GRADSYNC_SBIN_DIR}")
string(REPLACE "//" "/" GRADSYNC_DOC_DIR "${GRADSYNC_DOC_DIR}")

# Staged in a folder of this install's own: two installs may run at once (the tests install
# into scratch prefixes side by side), and neither may install the other's unit.
string(RANDOM LENGTH 12 token)
set(staged "${GRADSYNC_BINARY_DIR}/install-staged-${token}")
configure_file("${GRADSYNC_SOURCE_DIR}/gradsyncd.service.in" "${staged}/gradsyncd.service" @ONLY)
file(INSTALL DESTINATION "${prefix}/${GRADSYNC_UNIT_DIR}" TYPE FILE FILES "${staged}/gradsyncd.service")
file(REMOVE_RECURSE "${staged}")
# The shipped configuration is the operator's once installed: never overwrite an edited one.
set(config "$ENV{DESTDIR}${GRADSYNC_CONFIG_DIR}/gradsyncd.toml")
if(EXISTS "${config}")
  message(STATUS "Keeping: ${config} (an existing configuration is never replaced)")
else()
  file(INSTALL DESTINATION "${GRADSYNC_CONFIG_DIR}" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
       FILES "${GRADSYNC_SOURCE_DIR}/gradsyncd.toml.example" RENAME gradsyncd.toml)
endif()
